"""Keys, configs and known_hosts for the emulated hosts' real OpenSSH servers.

Every file lives in the harness's temp dir: one client key pair (the test process's identity),
one host key per host, and a known_hosts listing every host address with its key, so clients
run with StrictHostKeyChecking=yes exactly like a user who has verified their Macs.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it


def keygen(path: Path, comment: str) -> str:
    """Create an ed25519 key pair without a passphrase at `path`; return the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path.with_suffix(".pub").read_text().strip()


def sshd_config(
    state_dir: Path,
    host_key: Path,
    authorized_keys: Path,
    listen: Sequence[str],
    session_env: Mapping[str, str] | None = None,
) -> Path:
    """Write the sshd_config for one host: key-only root login, files in temp dirs;
    `session_env` is set in every session (what a host's own shell profile would set)."""
    env = " ".join(f"{k}={v}" for k, v in (session_env or {}).items())
    lines = [
        *([f"SetEnv {env}"] if env else []),
        *(f"ListenAddress {addr}:22" for addr in listen),
        f"HostKey {host_key}",
        f"PidFile {state_dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # PAM would want a login session set-up this container lacks; temp dirs fail StrictModes.
        "UsePAM no",
        "StrictModes no",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "LogLevel INFO",
        # Multi-host tests open several sessions per host at once (probe, reachability, ranks).
        "MaxStartups 50:30:100",
        "MaxSessions 50",
    ]
    path = state_dir / "sshd_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def check_config(config: Path) -> None:
    """`sshd -t`: fail early with sshd's own words when the config is unusable."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    done = subprocess.run(
        [SSHD, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise RuntimeError(f"sshd -t {config}: {done.stderr.strip()}")


def start_sshd(
    ns: str,
    state_dir: Path,
    authorized_keys: Path,
    listen: Sequence[str],
    session_env: Mapping[str, str] | None = None,
    mounts: Sequence[tuple[Path, Path]] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """Start one host's sshd in namespace `ns` (foreground, log in state_dir/sshd.log);
    return the process and the host's public key line. `mounts` (source, target): the host
    gets its own mount namespace where each target shows the source's files instead."""
    host_pub = keygen(state_dir / "host_key", f"{ns}-host")
    config = sshd_config(state_dir, state_dir / "host_key", authorized_keys, listen, session_env)
    check_config(config)
    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if mounts:
        binds = " && ".join(f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}"
                            for s, t in mounts)  # fmt: skip
        script = f"{binds} && exec {shlex.join(argv)}"
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    with (state_dir / "sshd.log").open("wb") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return proc, host_pub


def wait_for_sshd(
    proc: subprocess.Popen[bytes], ip: str, state_dir: Path, timeout_s: float
) -> None:
    """Until `ip:22` accepts connections; fail with sshd's log if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (state_dir / "sshd.log").read_text(errors="replace")
            raise RuntimeError(f"sshd for {ip} exited: {log.strip()[-500:]}")
        with contextlib.suppress(OSError), socket.create_connection((ip, 22), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd at {ip}:22 not reachable in {timeout_s}s")


def known_hosts_line(addresses: Sequence[str], host_pub: str) -> str:
    """One known_hosts line: every address of a host, then its key type and key."""
    key_type, key = host_pub.split()[:2]
    return f"{','.join(addresses)} {key_type} {key}"


def client_options(client_key: Path, known_hosts: Path, connect_timeout: int = 5) -> list[str]:
    """The ssh options a user's cluster file would carry for these hosts."""
    return [
        "-i",
        str(client_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
    ]
