"""`check`: the best backend this wiring supports today, and what blocks the one the user wants.

Every finding carries the set of backends it blocks; against the target backend those are errors
(exit 1) and the rest warnings. The best backend is the first of jaccl, jaccl-ring, ring that
nothing blocks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from topology.checks.addressing import address_findings
from topology.checks.blas import blas_findings
from topology.checks.versions import (
    SOFTWARE_UPDATE,
    env_findings,
    macos_findings,
    software_findings,
)
from topology.cluster_file import BACKENDS
from topology.errors import InputError
from topology.facts import VERSIONS_FILE, Backend, CheckResult, HostFacts, ProbeGap, Problem
from topology.finding import (
    ALL_BACKENDS,
    BACKEND_ORDER,
    NO_BACKEND,
    RDMA_BACKENDS,
    RING,
    Finding,
)
from topology.host_facts import (
    COMMANDS,
    IBV_DEVICES,
    IFCONFIG,
    RDMA_CTL,
    SSH_FAILED,
    SW_VERS,
    SYSCTL,
    TB_JSON,
    thunderbolt_iface_set,
)
from topology.link_problems import link_findings
from topology.links import LinkGraph, link_graph

MIN_RDMA_MACOS = (26, 2)  # RDMA over Thunderbolt arrived in macOS 26.2 (Apple TN3205)
MAX_JACCL_HOSTS = 8

CODE_ORDER = (
    "duplicate_host",
    "probe_missing",
    "not_a_mac",
    "macos_too_old",
    "macos_mismatch",
    "software_missing",
    "software_mismatch",
    "rdma_disabled",
    "rdma_no_devices",
    "tb_bridge_active",
    "too_many_hosts",
    "missing_link",
    "asymmetric_link",
    "rdma_port_down",
    "rdma_port_unsupported",
    "link_no_address",
    "link_address_mismatch",
    "slow_link",
    "unknown_peer",
    "no_address",
    "fast_synch_unsafe",
    "reference_blas",
)


# Without these a host is unknown: what it is and which macOS it runs. No backend can be vouched
# for on an unknown host, however many hosts there are (one Mac needs no cable, but it must be
# a Mac that answered).
ESSENTIAL_FILES = frozenset({SW_VERS})
_WHAT_IS_UNKNOWN = {SW_VERS: "whether it is a Mac and which macOS it runs"}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _unreachable(h: HostFacts) -> str | None:
    """ssh's reason when nothing came back from the host (every gap the same ssh failure)."""
    reasons = {g.reason for g in h.gaps}
    if len(reasons) == 1 and next(iter(reasons)).startswith(SSH_FAILED):
        return next(iter(reasons))
    return None


def unknown_hosts(hosts: Sequence[HostFacts]) -> tuple[str, ...]:
    """Hosts no verdict can rest on: unreachable, or an essential probe missing or unparsable."""
    return tuple(
        h.name
        for h in hosts
        if h.is_mac and (_unreachable(h) or any(g.file in ESSENTIAL_FILES for g in h.gaps))
    )


def _gap_blocks(h: HostFacts, gap: ProbeGap, rdma: frozenset[Backend]) -> frozenset[Backend]:
    """Which backends can't be verified without this file."""
    if gap.file in ESSENTIAL_FILES:
        return ALL_BACKENDS
    if gap.file in (SYSCTL, VERSIONS_FILE):
        return NO_BACKEND  # chip and memory, or versions: what they would tell is extra
    if gap.file == IFCONFIG:
        return rdma | (NO_BACKEND if h.ips else RING)
    if gap.file == RDMA_CTL and h.rdma_devices:
        return NO_BACKEND  # devices listed: RDMA is on and the hardware is Thunderbolt 5
    return rdma


def _probe_missing(h: HostFacts, rdma: frozenset[Backend]) -> list[Finding]:
    reason = _unreachable(h)
    if reason is not None:  # nothing came back: nothing is known, whatever the host count
        fix = (
            f"Check that `ssh {h.ssh or h.name} true` works without a password prompt, then take a "
            "new snapshot with `mlx-cluster topology snapshot`."
        )
        message = f"{h.name}: no file recorded ({reason}); nothing is known about this host"
        return [Finding("probe_missing", (h.name,), message, fix, ALL_BACKENDS)]
    found = []
    for g in h.gaps:
        cmd = " ".join(COMMANDS.get(g.file, (g.file,)))
        fix = (
            f"Run `{cmd}` on {h.name} and save its output as {h.name}/{g.file} in the snapshot, "
            "or take a new one with `mlx-cluster topology snapshot`."
        )
        if g.file == VERSIONS_FILE:  # written by the probe, not printed by one command
            fix = (
                f"Take a new snapshot with `mlx-cluster topology snapshot` (it records "
                f"{g.file} with {h.name}'s configured python), or delete {h.name}/{g.file}."
            )
        if g.file in _WHAT_IS_UNKNOWN:
            fix += f" Until then {_WHAT_IS_UNKNOWN[g.file]} is unknown."
        message = f"{h.name}: {g.file}: {g.reason}"
        found.append(Finding("probe_missing", (h.name,), message, fix, _gap_blocks(h, g, rdma)))
    return found


def _has_address(h: HostFacts) -> bool:
    if h.ips:
        return True
    for a in h.addrs:
        ip = ipaddress.ip_address(a.ip)
        if not (ip.is_loopback or ip.is_link_local):
            return True
    return False


def _mac_findings(h: HostFacts, rdma: frozenset[Backend]) -> list[Finding]:
    found = _probe_missing(h, rdma)
    gap_files = {g.file for g in h.gaps}
    if h.macos and _version(h.macos) < MIN_RDMA_MACOS:
        found.append(
            Finding(
                "macos_too_old",
                (h.name,),
                f"{h.name} runs macOS {h.macos}; RDMA over Thunderbolt needs macOS 26.2 or later",
                f"Update {h.name} to macOS 26.2 or later ({SOFTWARE_UPDATE}).",
                rdma,
            )
        )
    if h.rdma == "disabled":
        found.append(
            Finding(
                "rdma_disabled",
                (h.name,),
                f"RDMA is disabled on {h.name}",
                f"Boot {h.name} into Recovery (hold the power button until Options appears), open "
                "Utilities → Terminal, run `rdma_ctl enable`, then reboot.",
                rdma,
            )
        )
    if h.rdma == "enabled" and not h.rdma_devices and IBV_DEVICES not in gap_files:
        found.append(
            Finding(
                "rdma_no_devices",
                (h.name,),
                f"{h.name} has RDMA enabled but `ibv_devices` lists no rdma_ device: Thunderbolt "
                "4-class hardware, where jaccl would crash in ibv_reg_mr (mlx #3777)",
                f"Use `--backend ring` (TCP) with {h.name}, or replace it with a Thunderbolt 5 Mac "
                "(M4 Pro, M4 Max, M3 Ultra or newer) for RDMA.",
                rdma,
            )
        )
    in_bridge = sorted(set(h.bridge_members) & thunderbolt_iface_set(h))
    if h.bridge_active and in_bridge:
        deletes = "; ".join(f"sudo ifconfig bridge0 deletem {i}" for i in in_bridge)
        found.append(
            Finding(
                "tb_bridge_active",
                (h.name,),
                f"{h.name}: the Thunderbolt Bridge (bridge0) is active with {', '.join(in_bridge)} "
                "inside it; on a mesh that makes loops and broadcast storms",
                f"System Settings → Network → Thunderbolt Bridge → remove {', '.join(in_bridge)}, "
                f"or run `{deletes}` on {h.name}.",
                rdma,
            )
        )
    return found


def _host_findings(hosts: Sequence[HostFacts], graph: LinkGraph) -> list[Finding]:
    rdma = RDMA_BACKENDS if len(hosts) >= 2 else NO_BACKEND  # one Mac needs no RDMA
    found = [
        Finding(
            "duplicate_host",
            (a, b),
            f"{b} is the same Mac as {a} (same Thunderbolt bus ids or ssh destination)",
            f"Remove {b} from the cluster file (or its directory from the snapshot): "
            "list each Mac once.",
            ALL_BACKENDS,
        )
        for a, b in graph.duplicates
    ]
    dups = {b for _, b in graph.duplicates}
    for h in hosts:
        if h.name in dups:
            continue
        if not h.is_mac:
            why = h.gaps[0].reason if h.gaps else "sw_vers does not say macOS"
            found.append(
                Finding(
                    "not_a_mac",
                    (h.name,),
                    f"{h.name} is not a Mac ({why}); only the TCP ring backend can include it",
                    f"Use `--backend ring` for a cluster with {h.name}, or replace it with a Mac "
                    "on macOS 26.2+ wired by Thunderbolt 5.",
                    RDMA_BACKENDS,
                )
            )
        else:
            found.extend(_mac_findings(h, rdma))
        ifconfig_known = IFCONFIG not in {g.file for g in h.gaps}
        if not _has_address(h) and (ifconfig_known or not h.is_mac):  # Macs: probe_missing says it
            found.append(
                Finding(
                    "no_address",
                    (h.name,),
                    f"{h.name} has no IPv4 address (besides loopback/link-local) and no `ips:`",
                    f"Connect {h.name} to the network or set an address on a Thunderbolt port "
                    f"(System Settings → Network → Thunderbolt N → Details → TCP/IP), or add "
                    f"`ips: [...]` for {h.name} in the cluster file.",
                    RING,
                )
            )
    return found


def _findings(hosts: Sequence[HostFacts]) -> tuple[LinkGraph, list[Finding]]:
    graph = link_graph(hosts)
    found = _host_findings(hosts, graph)
    dups = {b for _, b in graph.duplicates}
    macs = [h for h in hosts if h.is_mac and h.name not in dups]
    rdma = RDMA_BACKENDS if len(hosts) >= 2 else NO_BACKEND
    found += macos_findings(macs, rdma)
    found += software_findings([h for h in hosts if h.name not in dups])
    found += blas_findings([h for h in hosts if h.name not in dups])
    if len(macs) > MAX_JACCL_HOSTS:
        found.append(
            Finding(
                "too_many_hosts",
                tuple(h.name for h in macs),
                f"jaccl joins at most {MAX_JACCL_HOSTS} Macs in a full mesh; here are {len(macs)}",
                "Use `--backend jaccl-ring` or `--backend ring`, or list at most 8 Macs.",
                frozenset({"jaccl"}),
            )
        )
    with_tb = [h for h in macs if TB_JSON not in {g.file for g in h.gaps}]
    found += link_findings(with_tb, graph, all_known=len(with_tb) == len(hosts))
    found += address_findings([h for h in hosts if h.name not in dups], graph)
    return graph, found


def _sorted(problems: Iterable[Problem], names: Sequence[str]) -> tuple[Problem, ...]:
    index = {n: i for i, n in enumerate(names)}
    rank = {c: i for i, c in enumerate(CODE_ORDER)}

    def key(p: Problem) -> tuple[bool, int, list[int], str]:
        where = [index.get(h, len(index)) for h in p.hosts]
        return (p.severity != "error", rank.get(p.code, len(rank)), where, p.message)

    return tuple(sorted(problems, key=key))


def check(hosts: Sequence[HostFacts], target: str = "auto", env: Sequence[str] = ()) -> CheckResult:
    """Validate the hosts against `target` (auto = jaccl, the full RDMA mesh); `env` is the
    cluster file's `env:` (settings every rank gets)."""
    if target not in BACKENDS:
        raise InputError(f"--backend: must be one of {', '.join(BACKENDS)}, got {target!r}")
    if not hosts:
        raise InputError("no hosts to check: give a cluster file, --hosts or --snapshot")
    goal = "jaccl" if target == "auto" else target
    graph, found = _findings(hosts)
    found += env_findings(env, hosts)
    backend = next((b for b in BACKEND_ORDER if not any(b in f.blocks for f in found)), None)
    problems = (
        Problem(f.code, "error" if goal in f.blocks else "warning", f.hosts, f.message, f.fix)
        for f in found
    )
    names = [h.name for h in hosts]
    return CheckResult(target, backend, tuple(hosts), graph.links, _sorted(problems, names))


def add_problems(result: CheckResult, extra: Iterable[Problem]) -> CheckResult:
    """The same result with more problems (e.g. the planner's model problems), re-ordered."""
    names = [h.name for h in result.hosts]
    problems = _sorted([*result.problems, *extra], names)
    return CheckResult(result.target, result.backend, result.hosts, result.links, problems)
