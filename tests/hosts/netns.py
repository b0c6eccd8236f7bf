"""Emulated hosts for multi-host tests: Linux network namespaces, veth links and real sshd.

    with EmulatedHosts(3, topology="mesh") as hosts:
        hosts.cluster_yaml(tmp / "cluster.yaml", backend="ring")
        hosts.run(0, ["ip", "route", "get", hosts[1].mesh_ips[0]])  # h1 end of cable h0-h1
        hosts.cut_link(0, 1)

Layout (every name starts with a per-run tag `mxh<pid><letter>` so parallel runs never clash and
a crashed run's leftovers are found and removed by the next run):
  * a "switch" namespace `<tag>-sw` holding bridge `br0`; every host has port `lan0` on it with an
    address in a /24 chosen free under a lock; the root namespace (the test process) joins the
    bridge through `<tag>r` (.254). The bridge sits in its own namespace so the root namespace's
    firewall (e.g. Docker's FORWARD DROP with br_netfilter) never sees the bridged traffic.
  * topology="switch": lan0 is THE network (netem applies to it).
  * topology="mesh": additionally one veth pair per host pair (`tb<j>` in host i's namespace is
    the cable to host j) with its own /30, like Thunderbolt IP links between Macs. lan0 then plays
    the Macs' Ethernet/Wi-Fi LAN: ssh and the test process use it, ranks use the /30s.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from paths import PYTHON

from hosts import openssh
from hosts.nsops import (
    MESH_NET,
    NamespacesUnavailable,
    NetemUnavailable,
    clean_stale,
    free_lan_prefix,
    ip,
    kill_namespace_processes,
    lan_lock,
    leftovers,
    namespaces,
    require,
    root_links,
    unavailable_reason,
)

__all__ = [
    "REPO",
    "VENV_PYTHON",
    "EmulatedHosts",
    "Host",
    "NamespacesUnavailable",
    "NetemUnavailable",
    "clean_stale",
    "leftovers",
    "require",
]

REPO = Path(__file__).resolve().parents[2]
# The interpreter running the tests (a venv's python, not resolved): ranks and scripts in the
# hosts use it too, as every host of a real cluster names its own in the cluster file.
VENV_PYTHON = PYTHON


@dataclass
class Host:
    index: int
    name: str  # host name in the cluster file: h0, h1, ...
    ns: str  # network namespace name
    ip: str  # lan0 address: what ssh and the test process use
    # Mesh only: this host's own address on the cable to each peer index.
    mesh_ips: dict[int, str] = field(default_factory=dict)
    sshd: subprocess.Popen[bytes] | None = None


class EmulatedHosts:
    """N hosts as network namespaces with real sshd; a context manager that always tears down."""

    def __init__(
        self,
        n: int,
        topology: str = "switch",
        netem: str | None = None,
        sshd: bool = True,
        private: Sequence[Path] = (),
        session_env: Mapping[str, str] | None = None,
    ) -> None:
        """`private`: directories each host sees its own (empty) copy of, as separate Macs
        would (their sessions run in a mount namespace; see private_path). `session_env`:
        set in every ssh session of every host."""
        if n < 1 or topology not in ("switch", "mesh"):
            raise ValueError("EmulatedHosts(n >= 1, topology='switch'|'mesh')")
        if topology == "mesh" and n * (n - 1) // 2 > MESH_NET.num_addresses // 4:
            raise ValueError(f"a mesh of {n} hosts needs more /30s than {MESH_NET} holds")
        self.n, self.topology, self.netem, self.with_sshd = n, topology, netem, sshd
        # The emulated hosts share this machine's cores, which a rank cannot see (it counts the
        # ranks at its own address): say so, as such a host's profile would (cluster/ring_wait.py).
        shared_cores = {"MLX_CLUSTER_RING_WAIT": "sleep"}
        self.private = [Path(p) for p in private]
        self.session_env = {**shared_cores, **(session_env or {})}
        self.hosts: list[Host] = []
        self.tag = ""
        self.tmp = Path()
        self.root_ip = ""  # the test process's own address on the lan
        self.client_key = Path()
        self.known_hosts = Path()

    # -- building -------------------------------------------------------------------------
    def __enter__(self) -> EmulatedHosts:
        reason = unavailable_reason(self.with_sshd)
        if reason:
            raise NamespacesUnavailable(reason)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _pick_tag(self) -> str:
        existing = namespaces() + root_links()
        for letter in "abcdefghijklmnopqrstuvwxyz":
            tag = f"mxh{os.getpid()}{letter}"
            if not any(name.startswith(tag) for name in existing):
                return tag
        raise RuntimeError("more than 26 EmulatedHosts alive in one process")

    def _build(self) -> None:
        with lan_lock():  # tag + lan prefix must be claimed atomically against parallel runs
            clean_stale()  # under the lock: test_netns plants fake leftovers holding it
            self.tag = self._pick_tag()
            prefix = free_lan_prefix()
            switch = f"{self.tag}-sw"
            ip("netns", "add", switch)
            ip("-n", switch, "link", "add", "br0", "type", "bridge")
            ip("-n", switch, "link", "set", "br0", "up")
            root_if = f"{self.tag}r"
            ip("link", "add", root_if, "type", "veth", "peer", "name", "up0", "netns", switch)
            self.root_ip = f"{prefix}.254"
            ip("addr", "add", f"{self.root_ip}/24", "dev", root_if)
            ip("link", "set", root_if, "up")
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        ip("-n", switch, "link", "set", "up0", "master", "br0", "up")
        for i in range(self.n):
            host = Host(i, f"h{i}", f"{self.tag}-h{i}", f"{prefix}.{i + 1}")
            ip("netns", "add", host.ns)
            ip("-n", host.ns, "link", "set", "lo", "up")
            ip("-n", host.ns, "link", "add", "lan0", "type", "veth", "peer", "name", f"p{i}",
                "netns", switch)  # fmt: skip
            ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
            ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "lan0")
            ip("-n", host.ns, "link", "set", "lan0", "up")
            self.hosts.append(host)
        if self.topology == "mesh":
            self._build_mesh()
        if self.netem:
            self._add_netem(self.netem)
        for host in self.hosts:
            self._wait_carrier(host, ["lan0", *self._data_ifaces(host)])
        if self.with_sshd:
            self._start_sshds()

    def _build_mesh(self) -> None:
        subnets = MESH_NET.subnets(new_prefix=30)
        for i in range(self.n):
            for j in range(i + 1, self.n):
                a, b = self.hosts[i], self.hosts[j]
                net = next(subnets)
                ip_a, ip_b = str(net[1]), str(net[2])
                ip("link", "add", f"tb{j}", "netns", a.ns, "type", "veth", "peer", "name",
                    f"tb{i}", "netns", b.ns)  # fmt: skip
                ip("-n", a.ns, "addr", "add", f"{ip_a}/30", "dev", f"tb{j}")
                ip("-n", b.ns, "addr", "add", f"{ip_b}/30", "dev", f"tb{i}")
                ip("-n", a.ns, "link", "set", f"tb{j}", "up")
                ip("-n", b.ns, "link", "set", f"tb{i}", "up")
                a.mesh_ips[j], b.mesh_ips[i] = ip_a, ip_b

    def _add_netem(self, netem: str) -> None:
        for host in self.hosts:
            for dev in self._data_ifaces(host):
                argv = ["tc", "qdisc", "add", "dev", dev, "root", "netem", *shlex.split(netem)]
                done = self.run(host.index, argv)
                if "qdisc kind is unknown" in done.stderr:
                    raise NetemUnavailable("this kernel has no sch_netem (CONFIG_NET_SCH_NETEM)")
                if done.returncode != 0:
                    raise ValueError(f"netem {netem!r}: {done.stderr.strip()}")

    def _wait_carrier(self, host: Host, devs: Sequence[str], timeout_s: float = 10) -> None:
        """Veth carrier comes up asynchronously (linkwatch, up to ~1 s): wait for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = ip("-n", host.ns, "-br", "link", "show").stdout.splitlines()
            state = {line.split()[0].split("@")[0]: line.split()[1] for line in out}
            if all(state.get(dev) == "UP" for dev in devs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name}: links {devs} not up after {timeout_s}s: {state}")
            time.sleep(0.05)

    def _data_ifaces(self, host: Host) -> list[str]:
        if self.topology == "switch":
            return ["lan0"]
        return [f"tb{j}" for j in sorted(host.mesh_ips)]

    def _start_sshds(self) -> None:
        self.client_key = self.tmp / "client_key"
        authorized = self.tmp / "authorized_keys"
        authorized.write_text(openssh.keygen(self.client_key, f"{self.tag}-client") + "\n")
        known: list[str] = []
        for host in self.hosts:
            state = self.tmp / host.name
            state.mkdir()
            addresses = [host.ip, *(host.mesh_ips[j] for j in sorted(host.mesh_ips))]
            mounts = []
            for target in self.private:
                target.mkdir(parents=True, exist_ok=True)
                source = self.private_path(host.index, target)
                source.mkdir(parents=True)
                mounts.append((source, target))
            host.sshd, host_pub = openssh.start_sshd(
                host.ns, state, authorized, addresses, self.session_env, mounts
            )
            known.append(openssh.known_hosts_line(addresses, host_pub))
        self.known_hosts = self.tmp / "known_hosts"
        self.known_hosts.write_text("\n".join(known) + "\n")
        for host in self.hosts:
            assert host.sshd is not None
            openssh.wait_for_sshd(host.sshd, host.ip, self.tmp / host.name, timeout_s=15)

    # -- tearing down ---------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process in the hosts (sshd, ranks...), delete namespaces, links, files."""
        if not self.tag:
            return
        for host in self.hosts:
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.kill()
                host.sshd.wait(timeout=10)
        for ns in [h.ns for h in self.hosts] + [f"{self.tag}-sw"]:
            if ns in namespaces():
                kill_namespace_processes(ns)
                ip("netns", "del", ns, check=False)
        ip("link", "del", f"{self.tag}r", check=False)  # normally gone with its peer already
        shutil.rmtree(self.tmp, ignore_errors=True)
        left = leftovers(self.tag)
        self.hosts = []
        if left:
            raise RuntimeError(f"emulated hosts teardown left {left}")

    # -- using ----------------------------------------------------------------------------
    def private_path(self, i: int, target: Path) -> Path:
        """Where the test process finds host i's own copy of a `private` directory."""
        k = self.private.index(Path(target))
        return self.tmp / self.hosts[i].name / "private" / str(k)

    def in_host(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv run as if on host i: its network and (with `private`) its mount namespace."""
        sshd = self.hosts[i].sshd
        if not self.private or sshd is None:
            return ["ip", "netns", "exec", self.hosts[i].ns, *argv]
        return ["nsenter", "-t", str(sshd.pid), "-m", "-n", "--", *argv]

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def run(
        self, i: int, argv: Sequence[str], timeout: float = 60, check: bool = False, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside host i's namespace (`ip netns exec`); output captured as text."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.hosts[i].ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.hosts[i].name}: {shlex.join(argv)}: {done.stderr.strip()}")
        return done

    def popen(self, i: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start argv in host i's namespace in the background (killed at teardown if alive)."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[i].ns, *argv], **kw)

    def pids(self, i: int) -> list[int]:
        """Every process currently living in host i's namespace (sshd included)."""
        return [int(p) for p in ip("netns", "pids", self.hosts[i].ns).stdout.split()]

    def ssh_options(self, connect_timeout: int = 5) -> list[str]:
        return openssh.client_options(self.client_key, self.known_hosts, connect_timeout)

    def ssh(self, i: int, remote: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """`ssh root@host_i -- remote` from the test process with the generated options."""
        argv = ["ssh", "-o", "BatchMode=yes", *self.ssh_options(), f"root@{self.hosts[i].ip}"]
        return subprocess.run(
            [*argv, "--", remote], capture_output=True, text=True, timeout=timeout
        )

    def set_link(self, i: int, j: int, up: bool) -> None:
        """Mesh: the cable i<->j up/down (both ends). Switch: i<->j traffic (blackhole routes)."""
        a, b = self.hosts[i], self.hosts[j]
        if self.topology == "mesh":
            for host, peer in ((a, b), (b, a)):
                ip("-n", host.ns, "link", "set", f"tb{peer.index}", "up" if up else "down")
            if up:
                self._wait_carrier(a, [f"tb{j}"])
                self._wait_carrier(b, [f"tb{i}"])
            return
        for host, peer in ((a, b), (b, a)):
            verb = "del" if up else "add"
            ip("-n", host.ns, "route", verb, "blackhole", f"{peer.ip}/32")

    def cut_link(self, i: int, j: int) -> None:
        self.set_link(i, j, up=False)

    def set_port(self, i: int, up: bool) -> None:
        """Host i's lan0 port on the switch up/down (unplugs the host from the lan)."""
        ip("-n", f"{self.tag}-sw", "link", "set", f"p{i}", "up" if up else "down")

    def stop_sshd(self, i: int) -> None:
        host = self.hosts[i]
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.kill()
            host.sshd.wait(timeout=10)

    def ring_ips(self, order: Sequence[int] | None = None) -> list[str]:
        """Each host's address the ring backend should use: switch = lan0; mesh = the address
        on the cable to its left neighbour in `order` (default 0..n-1)."""
        order = list(order) if order is not None else list(range(self.n))
        if self.topology == "switch" or self.n == 1:
            return [self.hosts[k].ip for k in order]
        return [self.hosts[k].mesh_ips[order[r - 1]] for r, k in enumerate(order)]

    def cluster_yaml(
        self,
        path: Path,
        ips: Mapping[int, Sequence[str]] | None = None,
        host_keys: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> Path:
        """Write a cluster file for these hosts as a user would. `ips` defaults to lan0 (switch)
        or the mesh /30 addresses in peer order (mesh); `host_keys` go into every host entry
        (e.g. wired_limit_gb: Linux hosts report no memory); `extra` = top-level keys."""
        hosts = []
        for h in self.hosts:
            if ips is not None:
                host_ips = list(ips[h.index])
            elif self.topology == "mesh":
                host_ips = [h.mesh_ips[j] for j in sorted(h.mesh_ips)]
            else:
                host_ips = [h.ip]
            entry = {"name": h.name, "ssh": f"root@{h.ip}", "ips": host_ips}
            hosts.append({**entry, "python": str(VENV_PYTHON), **(host_keys or {})})
        doc = {"hosts": hosts, "ssh_options": self.ssh_options(), **extra}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path
