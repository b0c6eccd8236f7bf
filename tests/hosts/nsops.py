"""Low-level pieces of the emulated-hosts harness: `ip` calls, namespace process cleanup,
leftover detection by tag, the lan-prefix lock, and the skip-or-fail rule for tests."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hosts import openssh

TAG_RE = re.compile(r"^mxh(\d+)[a-z]")
LAN_BASE = "10.200"  # lan /24s: 10.200.X.0/24, X picked free in the root namespace
MESH_NET = ipaddress.IPv4Network("10.201.0.0/24")  # carved into /30s; lives only inside hosts
LOCK_FILE = Path(tempfile.gettempdir()) / "mlx-cluster-netns.lock"


class NamespacesUnavailable(RuntimeError):
    """This machine cannot build emulated hosts (not root, no `ip`, no sshd...)."""


class NetemUnavailable(NamespacesUnavailable):
    """The kernel has no sch_netem (CONFIG_NET_SCH_NETEM), so delay/loss cannot be emulated."""


def unavailable_reason(need_sshd: bool = True) -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns)"
    if shutil.which("ip") is None:
        return "emulated hosts need iproute2 (`ip`)"
    if need_sshd and not Path(openssh.SSHD).exists():
        return "emulated hosts need openssh-server (run scripts/ci_system_deps)"
    if need_sshd and shutil.which("ssh") is None:
        return "emulated hosts need the ssh client (openssh-client)"
    return None


def require(need_sshd: bool = True, reason: str | None = None) -> None:
    """In a test: skip with one clear reason when emulated hosts are impossible here, but FAIL
    when CI=true (CI must run these tests, never silently skip them)."""
    import pytest

    reason = reason or unavailable_reason(need_sshd)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace_processes(ns: str, grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process living in namespace `ns` (all started by a harness)."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        pids = [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if time.monotonic() > deadline + 5:
            raise RuntimeError(f"processes {pids} in namespace {ns} survive SIGKILL")
        time.sleep(0.1)


def namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def root_links() -> list[str]:
    out = ip("-o", "link", "show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def leftovers(tag: str) -> list[str]:
    """Namespaces and root-namespace links whose names start with `tag` (empty = clean)."""
    return [n for n in namespaces() + root_links() if n.startswith(tag)]


def clean_stale() -> None:
    """Remove what a crashed earlier run left: namespaces/links whose owner pid is dead."""
    for name in namespaces():
        m = TAG_RE.match(name)
        if m and not alive(int(m.group(1))):
            kill_namespace_processes(name)
            ip("netns", "del", name, check=False)
    for name in root_links():
        m = TAG_RE.match(name)
        if m and not alive(int(m.group(1))):
            ip("link", "del", name, check=False)
    for path in Path(tempfile.gettempdir()).glob("mxh*"):
        m = TAG_RE.match(path.name)
        if m and not alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def free_lan_prefix() -> str:
    """A 10.200.X /24 no root-namespace address or route uses (call with the lock held)."""
    used = ip("-4", "-o", "addr", "show").stdout + ip("-4", "route", "show").stdout
    for x in range(256):
        prefix = f"{LAN_BASE}.{x}"
        if f"{prefix}." not in used:
            return prefix
    raise RuntimeError(f"no free {LAN_BASE}.X.0/24 left for emulated hosts")


@contextlib.contextmanager
def lan_lock() -> Iterator[None]:
    with LOCK_FILE.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
