"""How close a model copy from the launching host comes to the link's raw TCP throughput.

    .venv/bin/python scripts/bench_transfer.py [--files 4] [--file-mib 256] [--reps 3]
        [--parallel 4] [--netns [--rate 1gbit]] [--dest-root /dev/shm]

In one run, on the same link, alternating (raw, ours, raw, ours, ...):
  raw   one TCP connection; the sender sendfile()s the files back to back, the receiver reads
        into a buffer and throws it away: what the link carries at best.
  ours  cluster/files/file_server.py's ModelFileServer and the rank's cluster.files.peer_fetch
        client (`--parallel` files at a time), written to a fresh folder and sha256-checked.
and prints ours/raw (the goal is >= 0.80). Default link: loopback. `--netns` puts the senders
and the receivers in two network namespaces joined by a veth pair (needs root), and `--rate`
shapes the senders' side with a tbf qdisc to emulate a slower link; the namespaces are always
removed. Every side runs in its own process (this script with a hidden --role), so no side
shares a GIL with another. MLX_CLUSTER_CACHE points at a temporary folder for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER_IP, CLIENT_IP = "10.231.0.1", "10.231.0.2"  # the veth pair's ends in --netns mode
GOAL = 0.80
_RATE = re.compile(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", re.IGNORECASE)


# -- the roles, each run in its own process --------------------------------------------------


def role_raw_send(bind: str, files: list[str]) -> None:
    """Listen; for every connection, sendfile() all files back to back, then close."""
    with socket.create_server((bind, 0)) as listener:
        print(listener.getsockname()[1], flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                for name in files:
                    with open(name, "rb") as f:
                        conn.sendfile(f)


def role_raw_recv(host: str, port: int) -> None:
    buf = bytearray(4 << 20)
    got = 0
    start = time.perf_counter()
    with socket.create_connection((host, port)) as conn:
        while n := conn.recv_into(buf):
            got += n
    print(json.dumps({"bytes": got, "seconds": time.perf_counter() - start}), flush=True)


def role_share_serve(bind: str, token: str, files: list[str]) -> None:
    """Serve until stdin closes (the orchestrator holds it open)."""
    from cluster.files.file_server import ModelFileServer

    with ModelFileServer({Path(f).name: Path(f) for f in files}, token, [bind]) as server:
        print(server.url(bind), flush=True)
        sys.stdin.read()


def role_share_recv(url: str, token: str, names: list[str]) -> None:
    """The server alone: GET every file on one keep-alive connection, read and discard."""
    import http.client
    from urllib.parse import quote, urlsplit

    parts = urlsplit(url)
    buf = memoryview(bytearray(4 << 20))
    got = 0
    start = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port)
    for name in names:
        conn.request("GET", f"/files/{quote(name)}", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        if response.status != 200:
            raise SystemExit(f"{name}: HTTP {response.status}")
        while n := response.readinto(buf):
            got += n
    conn.close()
    print(json.dumps({"bytes": got, "seconds": time.perf_counter() - start}), flush=True)


def role_share_fetch(url: str, token: str, manifest: str, dest: str, parallel: int) -> None:
    from cluster.files.manifest import FileEntry
    from cluster.files.peer_fetch import fetch_from_peers

    raw: dict[str, list[Any]] = json.loads(Path(manifest).read_text())
    wanted = {name: FileEntry(size, digest) for name, (size, digest) in raw.items()}
    start = time.perf_counter()
    report = fetch_from_peers([url], token, wanted, Path(dest), progress=None, parallel=parallel)
    seconds = time.perf_counter() - start
    print(json.dumps({"bytes": report.bytes, "files": report.files, "seconds": seconds}))


# -- the orchestrator -------------------------------------------------------------------------


def rate_bytes(rate: str) -> float:
    """tc's rate syntax, the common units: 1gbit, 500mbit, 100mbps (bytes per second)."""
    m = _RATE.fullmatch(rate.strip())
    if m is None:
        raise SystemExit(f"--rate {rate!r}: expected e.g. 1gbit, 500mbit, 100mbps")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    return value / 8 if m.group(3).lower() == "bit" else value


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextlib.contextmanager
def namespaces(rate: str | None) -> Iterator[tuple[list[str], list[str], str]]:
    """Two namespaces joined by a veth pair; yields (server prefix, client prefix, link)."""
    tag = f"mlxb{os.getpid() % 100000}"
    ns_s, ns_c = f"{tag}s", f"{tag}c"
    try:
        run(["ip", "netns", "add", ns_s])
        run(["ip", "netns", "add", ns_c])
        run(["ip", "link", "add", f"{tag}s", "type", "veth", "peer", "name", f"{tag}c"])
        for ns, dev, ip in ((ns_s, f"{tag}s", SERVER_IP), (ns_c, f"{tag}c", CLIENT_IP)):
            run(["ip", "link", "set", dev, "netns", ns])
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
            run(["ip", "-n", ns, "link", "set", dev, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        link = "veth between two network namespaces"
        if rate:
            # The data flows server -> client: shaping the server's egress shapes the copy.
            # Burst: 4 ms at the rate (at least 64 KiB), so the kernel's timer can keep up.
            burst = max(int(rate_bytes(rate) * 0.004), 64 << 10)
            tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
            run(["ip", "netns", "exec", ns_s, "tc", "qdisc", "add", "dev", f"{tag}s", "root", *tbf])
            link += f", tbf rate {rate} burst {burst // 1024} KiB latency 50ms"
        yield ["ip", "netns", "exec", ns_s], ["ip", "netns", "exec", ns_c], link
    finally:
        for ns in (ns_s, ns_c):  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def role_cmd(prefix: list[str], *args: str) -> list[str]:
    return [*prefix, sys.executable, str(Path(__file__).resolve()), "--role", *args]


def start_server(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if not first:
        proc.kill()
        raise SystemExit(f"{' '.join(cmd)}: did not start")
    return proc, first


def measure(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=3600)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def make_files(folder: Path, count: int, mib: int) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i in range(count):
        path = folder / f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))  # random: nothing on the way can compress it
        paths.append(path)
    return paths


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def stop(proc: subprocess.Popen[str], stdin: IO[str] | None) -> None:
    with contextlib.suppress(OSError):
        if stdin is not None:
            stdin.close()
    with contextlib.suppress(OSError):
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench(args: argparse.Namespace, tmp: Path) -> int:
    env = {**os.environ, "MLX_CLUSTER_CACHE": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
    os.environ["MLX_CLUSTER_CACHE"] = env["MLX_CLUSTER_CACHE"]  # folder_manifest's digests
    from cluster.files.manifest import folder_manifest

    files = make_files(tmp / "src", args.files, args.file_mib)
    manifest, _ = folder_manifest(tmp / "src")
    manifest_path = tmp / "manifest.json"
    manifest_path.write_text(json.dumps(manifest.to_json()["files"]))
    total = sum(p.stat().st_size for p in files)
    dest_root = Path(tempfile.mkdtemp(prefix="bench-dest-", dir=args.dest_root or tmp))
    token = secrets.token_urlsafe(32)

    with contextlib.ExitStack() as stack:
        if args.netns:
            srv, cli, link = stack.enter_context(namespaces(args.rate))
            server_ip = SERVER_IP
        else:
            srv, cli, link, server_ip = [], [], "loopback (127.0.0.1)", "127.0.0.1"
        names = [str(p) for p in files]
        raw_proc, port = start_server(role_cmd(srv, "raw-send", server_ip, *names), env)
        stack.callback(stop, raw_proc, raw_proc.stdin)
        share_proc, url = start_server(role_cmd(srv, "share-serve", server_ip, token, *names), env)
        stack.callback(stop, share_proc, share_proc.stdin)

        rows: list[tuple[float, float, float]] = []  # bytes/s: raw, server only, ours
        cpu = [0.0, 0.0]  # the senders' CPU seconds: raw, ours
        for rep in range(args.reps):
            before = cpu_seconds(raw_proc.pid)
            raw = measure(role_cmd(cli, "raw-recv", server_ip, port), env)
            cpu[0] += cpu_seconds(raw_proc.pid) - before
            served = measure(role_cmd(cli, "share-recv", url, token, *manifest.files), env)
            dest = dest_root / f"rep{rep}"
            fetch = [str(manifest_path), str(dest), str(args.parallel)]
            before = cpu_seconds(share_proc.pid)
            ours = measure(role_cmd(cli, "share-fetch", url, token, *fetch), env)
            cpu[1] += cpu_seconds(share_proc.pid) - before
            for what, got in (("raw", raw), ("server-only", served), ("our", ours)):
                if got["bytes"] != total:
                    raise SystemExit(f"{what} copy received {got['bytes']} of {total} bytes")
            if rep == 0:  # the client checks every file; check it independently once
                for name, entry in manifest.files.items():
                    if sha256(dest / name) != entry.sha256:
                        raise SystemExit(f"our copy of {name} differs from the source")
            shutil.rmtree(dest)
            rows.append(
                (total / raw["seconds"], total / served["seconds"], total / ours["seconds"])
            )
            raw_bps, _, ours_bps = rows[-1]
            print(
                f"  rep {rep + 1}: raw {raw_bps / 1e6:.1f} MB/s, ours {ours_bps / 1e6:.1f} MB/s",
                file=sys.stderr,
                flush=True,
            )
        shared = pull_together(args.pullers, cli, url, token, manifest_path, dest_root, args, env)
    shutil.rmtree(dest_root, ignore_errors=True)

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    )
    print(f"link: {link}")
    print(
        f"files: {len(files)} x {args.file_mib} MiB random ({total / 2**20:.0f} MiB), "
        f"ours with parallel={args.parallel}, written under {dest_root.parent}"
    )
    print()
    print("server only: ModelFileServer to a client that reads and discards (no hash, no write)")
    print("ours: ModelFileServer + cluster.files.peer_fetch (hash, write, fsync, rename)")
    print()
    print("| rep | raw TCP MB/s | server only MB/s | ours MB/s | server only/raw | ours/raw |")
    print("|---:|---:|---:|---:|---:|---:|")
    medians = [statistics.median(row[i] for row in rows) for i in range(3)]
    for label, (raw_bps, served_bps, ours_bps) in [
        *((str(i), row) for i, row in enumerate(rows, 1)),
        ("median", tuple(medians)),
    ]:
        print(
            f"| {label} | {raw_bps / 1e6:.1f} | {served_bps / 1e6:.1f} | {ours_bps / 1e6:.1f} "
            f"| {served_bps / raw_bps:.2f} | {ours_bps / raw_bps:.2f} |"
        )
    ratio = medians[2] / medians[0]
    print()
    verdict = "meets" if ratio >= GOAL else "misses"
    print(f"ours/raw {ratio:.2f} (of the medians): {verdict} the goal of {GOAL:.2f}")
    if any(cpu):
        gib = total * args.reps / 2**30
        print(
            f"sender CPU per GiB sent: raw {cpu[0] / gib:.2f} s, "
            f"ModelFileServer {cpu[1] / gib:.2f} s"
        )
    if shared:
        each = ", ".join(f"{bps / 1e6:.1f}" for bps in shared)
        print(
            f"{len(shared)} ranks pulling at once: {each} MB/s; slowest/fastest "
            f"{min(shared) / max(shared):.2f}, together/raw {sum(shared) / medians[0]:.2f}"
        )
    return 0 if ratio >= GOAL else 1


def pull_together(
    n: int,
    cli: list[str],
    url: str,
    token: str,
    manifest_path: Path,
    dest_root: Path,
    args: argparse.Namespace,
    env: dict[str, str],
) -> list[float]:
    """N ranks fetching the same files from one server at once: each one's bytes/s."""
    if n < 2:
        return []
    procs = []
    for i in range(n):
        fetch = [str(manifest_path), str(dest_root / f"together{i}"), str(args.parallel)]
        cmd = role_cmd(cli, "share-fetch", url, token, *fetch)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    rates = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        got = json.loads(out.strip().splitlines()[-1])
        rates.append(got["bytes"] / got["seconds"])
    return rates


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, rest = sys.argv[2], sys.argv[3:]
        if role == "raw-send":
            role_raw_send(rest[0], rest[1:])
        elif role == "raw-recv":
            role_raw_recv(rest[0], int(rest[1]))
        elif role == "share-serve":
            role_share_serve(rest[0], rest[1], rest[2:])
        elif role == "share-recv":
            role_share_recv(rest[0], rest[1], rest[2:])
        elif role == "share-fetch":
            role_share_fetch(rest[0], rest[1], rest[2], rest[3], int(rest[4]))
        else:
            raise SystemExit(f"unknown role {role!r}")
        return 0

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=4, help="how many files (default 4)")
    parser.add_argument("--file-mib", type=int, default=256, help="size of each (default 256)")
    parser.add_argument("--reps", type=int, default=3, help="raw/ours pairs (default 3)")
    parser.add_argument("--parallel", type=int, default=4, help="client's files at a time")
    parser.add_argument(
        "--pullers", type=int, default=2, help="ranks pulling at once, for fairness (default 2)"
    )
    parser.add_argument("--netns", action="store_true", help="two namespaces + veth (root)")
    parser.add_argument("--rate", help="with --netns: shape the link, e.g. 1gbit")
    parser.add_argument(
        "--dest-root", help="where the copies are written (default: the run's temp folder)"
    )
    args = parser.parse_args()
    if args.rate and not args.netns:
        parser.error("--rate needs --netns")
    if args.rate:
        rate_bytes(args.rate)  # fail before making files
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as tmp:
        return bench(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
