"""`topology setup --apply`: run the planned commands over ssh with `sudo -n`, then check again.

Nothing runs anywhere until every host that has commands has passed `sudo -n true` (sudo that
would ask for a password is refused by name: ssh runs without a terminal, so nobody could type
it) and every one of them is a Mac. A host that is not a Mac has no commands and is never
contacted. Each host's commands run in the printed order and stop at the first failure.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from launcher.hosts.gather import probe_facts
from launcher.hosts.reachability import EXIT_UNREACHABLE, Unreachable
from launcher.hosts.ssh import is_local, ssh_argv
from topology.cluster_file import ClusterSpec, HostSpec
from topology.errors import one_line
from topology.facts import CheckResult, HostFacts
from topology.problems import check
from topology.setup.plan import SetupPlan

COMMAND_TIMEOUT_S = 60.0  # networksetup can take a few seconds while the service restarts
SSH_EXIT = 255
SUDO_CHECK = ("sudo", "-n", "true")
EXIT_NOT_READY = 1

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Ran:
    rc: int
    stderr: str  # its last non-empty line


def _run(spec: ClusterSpec, host: HostSpec, argv: Sequence[str]) -> Ran:
    """argv on the host: here for `localhost`, else over ssh (never through a local shell)."""
    full = list(argv) if is_local(host) else ssh_argv(spec, host, argv)
    try:
        done = subprocess.run(
            full,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Ran(124, f"no answer within {COMMAND_TIMEOUT_S:g} s")
    except FileNotFoundError:
        return Ran(127, f"{full[0]}: command not found")
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    return Ran(done.returncode, one_line(lines[-1], 300) if lines else "")


@dataclass(frozen=True)
class Refusal:
    host: str
    reason: str

    def line(self) -> str:
        return f"{self.host}: {self.reason}"


def _gate(
    spec: ClusterSpec, plan: SetupPlan, facts: dict[str, HostFacts]
) -> tuple[list[Unreachable], list[Refusal]]:
    """Every host with commands must be a Mac whose sudo does not ask for a password."""
    specs = {h.name: h for h in spec.hosts}
    todo = [h.name for h in plan.hosts if h.commands]
    refused = [
        Refusal(n, "is not a Mac: setup never changes anything there")
        for n in todo
        if not facts[n].is_mac
    ]
    asked = [n for n in todo if facts[n].is_mac]
    unreachable: list[Unreachable] = []
    if not asked:
        return unreachable, refused
    with ThreadPoolExecutor(max_workers=min(16, len(asked))) as pool:
        answers = list(pool.map(lambda n: _run(spec, specs[n], SUDO_CHECK), asked))
    for name, ran in zip(asked, answers, strict=True):
        if ran.rc == SSH_EXIT and not is_local(specs[name]):
            unreachable.append(Unreachable(specs[name], ran.stderr or "ssh failed"))
        elif ran.rc == 127:
            refused.append(Refusal(name, f"has no sudo ({ran.stderr or 'not found'})"))
        elif ran.rc != 0:
            why = f" ({ran.stderr})" if ran.stderr else ""
            refused.append(
                Refusal(
                    name,
                    f"sudo would ask for a password{why}: allow password-less sudo for "
                    "networksetup and ifconfig there, or run the printed commands on it yourself",
                )
            )
    return unreachable, refused


def _run_commands(spec: ClusterSpec, plan: SetupPlan, echo: Echo) -> bool:
    """Each host's commands in order; a host stops at its first failure. True if all ran."""
    specs = {h.name: h for h in spec.hosts}
    ok = True
    for h in plan.hosts:
        for argv, line in zip(h.commands, h.lines(), strict=True):
            ran = _run(spec, specs[h.name], ("sudo", "-n", *argv))
            if ran.rc == 0:
                echo(f"{h.name}: {line}: done")
                continue
            echo(
                f"{h.name}: {line}: failed (exit {ran.rc}){': ' + ran.stderr if ran.stderr else ''}"
            )
            ok = False
            break
    return ok


@dataclass(frozen=True)
class Applied:
    exit_code: int
    after: CheckResult | None = None  # the check of the hosts probed again


def apply_setup(
    spec: ClusterSpec, plan: SetupPlan, facts: Sequence[HostFacts], echo: Echo, fail: Echo
) -> Applied:
    """Run the plan, probe again, check. `echo` reports progress, `fail` one line per refusal."""
    by_name = {h.name: h for h in facts}
    for h in plan.hosts:
        if not by_name[h.name].is_mac:
            echo(f"{h.name}: not a Mac; setup leaves it alone")
    unreachable, refused = _gate(spec, plan, by_name)
    for u in unreachable:
        fail(u.line())
    if unreachable:
        return Applied(EXIT_UNREACHABLE)
    for r in refused:
        fail(f"{r.line()}; nothing was changed on any host")
    if refused:
        return Applied(EXIT_NOT_READY)
    ran_all = _run_commands(spec, plan, echo)
    after = check(probe_facts(spec), plan.target, spec.env)
    ready = ran_all and after.ok
    return Applied(0 if ready else EXIT_NOT_READY, after)
