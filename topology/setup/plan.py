"""What `topology setup` would do on each host, and what only a person can do.

Per host, in this order: take the Thunderbolt ports out of an active bridge0 (a bridge on a mesh
loops broadcasts), then give every cable between the hosts that lacks a working pair of addresses
its own /30 (for RDMA targets not the cables in a port that does no RDMA: those must move), set
persistently with `networksetup -setmanual` on the port's network service (named as
`networksetup -listallhardwareports` names the port: `Thunderbolt <n>`). Nothing is planned for a
host that is not a Mac or whose interfaces are unknown. The manual steps are what `check` would
still report as errors once the commands have run: that is computed, not guessed, by checking
the facts as the commands leave them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Network
from typing import cast

from topology.checks.addressing import addressable, link_addresses, link_use
from topology.cluster_file import BACKENDS
from topology.errors import InputError
from topology.facts import Backend, CheckResult, HostFacts, IfaceAddr, Link
from topology.finding import RDMA_BACKENDS
from topology.host_facts import thunderbolt_iface_set
from topology.links import LinkGraph, find_ring, is_full_mesh, link_graph
from topology.problems import MAX_JACCL_HOSTS, check
from topology.setup.subnets import CABLE_PREFIX, SubnetPool, taken_networks

# Interface names that go on a command line: what macOS names them (en5, bridge0), nothing else.
_IFACE = re.compile(r"[a-z]{1,8}[0-9]{1,4}")


@dataclass(frozen=True)
class HostSetup:
    name: str
    commands: tuple[tuple[str, ...], ...] = ()  # argv of each command; each runs under sudo

    def lines(self) -> list[str]:
        """The commands as a person types them on that Mac."""
        return [shlex.join(("sudo", *argv)) for argv in self.commands]


@dataclass(frozen=True)
class LinkSetup:
    """A cable in use and the addresses it has once setup has run (`new`: setup sets them)."""

    a: str
    a_iface: str
    a_ip: str
    b: str
    b_iface: str
    b_ip: str
    prefix_len: int
    new: bool


@dataclass(frozen=True)
class ManualStep:
    host: str
    step: str


@dataclass(frozen=True)
class SetupPlan:
    target: Backend
    hosts: tuple[HostSetup, ...]
    links: tuple[LinkSetup, ...]
    manual: tuple[ManualStep, ...]
    after: CheckResult  # the check of the facts as the commands leave them

    @property
    def commands(self) -> int:
        return sum(len(h.commands) for h in self.hosts)

    @property
    def nothing_to_do(self) -> bool:
        return self.commands == 0 and not self.manual


def cables_allow(hosts: Sequence[HostFacts], graph: LinkGraph) -> Backend:
    """The best backend the cables as plugged allow (RDMA state and addresses aside)."""
    dups = {b for _, b in graph.duplicates}
    live = [h for h in hosts if h.name not in dups]
    if not all(h.is_mac for h in live):
        return "ring"
    names = [h.name for h in live]
    if len(names) < 2 or (len(names) <= MAX_JACCL_HOSTS and is_full_mesh(graph, names)):
        return "jaccl"
    return "jaccl-ring" if find_ring(graph, names, rdma=False) else "ring"


def _safe(k: Link) -> bool:
    return all(i is not None and _IFACE.fullmatch(i) for i in (k.a_iface, k.b_iface))


def _bridge_members(h: HostFacts, goal: Backend, in_use: set[str]) -> list[str]:
    """Thunderbolt members of an active bridge0 to take out (all of them for RDMA)."""
    if not (h.is_mac and h.bridge_active and addressable(h)):
        return []
    members = sorted(set(h.bridge_members) & thunderbolt_iface_set(h))
    if goal not in RDMA_BACKENDS and not set(members) & in_use:
        return []  # a TCP ring over the LAN does not care about the bridge
    return [m for m in members if _IFACE.fullmatch(m)]


def _mask(prefix: int) -> str:
    return str(IPv4Network(f"0.0.0.0/{prefix}").netmask)


def _plan_links(
    hosts: Sequence[HostFacts], links: Sequence[Link]
) -> tuple[list[LinkSetup], dict[str, list[tuple[str, ...]]]]:
    """Each cable's addresses: kept when they work, else a new /30 and its two commands."""
    by_name = {h.name: h for h in hosts}
    pool = SubnetPool(taken_networks(hosts))
    out: list[LinkSetup] = []
    commands: dict[str, list[tuple[str, ...]]] = {h.name: [] for h in hosts}
    for k in links:
        state = link_addresses(k, by_name)
        if state.state == "unknown" or not _safe(k):
            continue  # a probe gap: check reports it, nothing can be planned on guesses
        assert k.a_iface is not None and k.b_iface is not None
        if state.state == "ok" and state.a is not None and state.b is not None:
            out.append(
                LinkSetup(
                    k.a, k.a_iface, state.a.ip, k.b, k.b_iface, state.b.ip, state.a.prefix, False
                )
            )
            continue
        net = pool.take()
        a_ip, b_ip = str(net[1]), str(net[2])
        out.append(LinkSetup(k.a, k.a_iface, a_ip, k.b, k.b_iface, b_ip, CABLE_PREFIX, True))
        for host, port, ip in ((k.a, k.a_port, a_ip), (k.b, k.b_port, b_ip)):
            argv = ("networksetup", "-setmanual", f"Thunderbolt {port}", ip, _mask(CABLE_PREFIX))
            commands[host].append(argv)
    return out, commands


def predicted(
    hosts: Sequence[HostFacts], links: Sequence[LinkSetup], removed: dict[str, list[str]]
) -> tuple[HostFacts, ...]:
    """The facts as the commands leave them: new addresses in place, bridge members gone."""
    out = []
    for h in hosts:
        new = [
            IfaceAddr(iface, ip, k.prefix_len)
            for k in links
            if k.new
            for host, iface, ip in ((k.a, k.a_iface, k.a_ip), (k.b, k.b_iface, k.b_ip))
            if host == h.name
        ]
        redone = {a.iface for a in new}  # -setmanual replaces the service's IPv4 settings
        addrs = tuple(a for a in h.addrs if a.iface not in redone) + tuple(new)
        gone = set(removed.get(h.name, ()))
        members = tuple(m for m in h.bridge_members if m not in gone)
        out.append(replace(h, addrs=addrs, bridge_members=members))
    return tuple(out)


def plan_setup(
    hosts: Sequence[HostFacts], target: str = "auto", env: Sequence[str] = ()
) -> SetupPlan:
    """The commands per host, the links with their addresses, and the manual steps."""
    if target not in BACKENDS:
        raise InputError(f"--backend: must be one of {', '.join(BACKENDS)}, got {target!r}")
    if not hosts:
        raise InputError("no hosts to set up: give a cluster file, --hosts or --snapshot")
    graph = link_graph(hosts)
    goal = cables_allow(hosts, graph) if target == "auto" else cast(Backend, target)
    dups = {b for _, b in graph.duplicates}
    live = [h for h in hosts if h.name not in dups]
    # Every cable, not just those the target needs: an address costs nothing and the next
    # target (another cable plugged in, jaccl instead of jaccl-ring) finds it ready.
    use = link_use(live, graph)
    in_use = use.jaccl if goal in RDMA_BACKENDS else graph.links
    links, link_commands = _plan_links(live, in_use)
    used_ifaces = {(k.a, k.a_iface) for k in in_use} | {(k.b, k.b_iface) for k in in_use}
    removed: dict[str, list[str]] = {}
    setups = []
    for h in hosts:
        mine = {i for n, i in used_ifaces if n == h.name and i}
        members = _bridge_members(h, goal, mine) if h.name not in dups else []
        removed[h.name] = members
        bridge = [("ifconfig", "bridge0", "deletem", m) for m in members]
        setups.append(HostSetup(h.name, tuple(bridge + link_commands.get(h.name, []))))
    after = check(predicted(hosts, links, removed), goal, env)
    manual: list[ManualStep] = []
    for p in after.problems:
        step = ManualStep(p.hosts[0] if p.hosts else "", p.fix)
        if p.severity == "error" and step not in manual:
            manual.append(step)
    return SetupPlan(goal, tuple(setups), tuple(links), tuple(manual), after)
