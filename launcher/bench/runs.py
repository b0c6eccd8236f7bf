"""The runs of a benchmark: a plan per host count and strategy, each run through the same
supervised ranks as `launch` (job.mode "bench" / "calibrate"; cluster/bench/measure.py).

Host counts take the first k hosts of the cluster file (probed once), or k ranks on this
machine for --local. One host splits nothing, so it runs once and is every strategy's baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cluster.job import RankJob
from launcher.ranks.jobs import DEFAULT_PORT, Generation, build_rank_jobs
from launcher.ranks.supervisor import Deadlines, Outcome, supervise
from launcher.ranks.target import LaunchTarget, rank_launches
from launcher.share.offer import ModelShare
from topology.cluster_file import ClusterSpec
from topology.facts import HostFacts
from topology.model.spec import ModelSpec
from topology.planning.calibration import Calibration, LinkMeasurement, StepTimes
from topology.planning.hostfile import hostfile_json
from topology.planning.plan import Plan, plan_cluster, plan_local
from topology.problems import check

PlanFn = Callable[[int, str, Calibration | None], tuple[Plan, dict[str, Any]]]


@dataclass(frozen=True)
class BenchSettings:
    prompt_tokens: int
    gen_tokens: int
    trials: int
    warmup: int = 1
    seed: int = 0
    speculative: str = "off"  # on: prompt-lookup drafts checked in the forward (--speculative)
    draft_model: str | None = None  # as the ranks load it (--draft-model; checked already)

    def options(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "trials": self.trials,
            "warmup": self.warmup,
            "speculative": self.speculative,
            **({"draft_model": self.draft_model} if self.draft_model else {}),
        }


@dataclass(frozen=True)
class Case:
    """One host count: the strategies it stands for (all of them for 1 host) and its plan."""

    hosts: int
    strategies: tuple[str, ...]
    target: LaunchTarget | None  # None: no valid plan
    reason: str = ""  # why there is no valid plan

    @property
    def label(self) -> str:
        return f"{'/'.join(self.strategies)} × {self.hosts}"


@dataclass(frozen=True)
class BenchPlanner:
    """Plans k of the available hosts; `cluster` is None for --local."""

    plan_fn: PlanFn
    max_hosts: int
    cluster: ClusterSpec | None = None
    facts: tuple[HostFacts, ...] = ()

    def plan(self, k: int, strategy: str, calibration: Calibration | None) -> Plan:
        return self.plan_fn(k, strategy, calibration)[0]

    def case(self, k: int, strategies: tuple[str, ...]) -> Case:
        plan, hostfile = self.plan_fn(k, strategies[0], None)
        if not plan.ok:
            return Case(k, strategies, None, refusal(plan))
        if self.cluster is None:
            return Case(k, strategies, LaunchTarget(plan, hostfile))
        hosts = replace(self.cluster, hosts=self.cluster.hosts[:k])
        return Case(k, strategies, LaunchTarget(plan, hostfile, hosts, port=DEFAULT_PORT))


def refusal(plan: Plan) -> str:
    """The planner's reason, with the first blocking problem's fix."""
    first = next((p for p in plan.problems if p.severity == "error"), None)
    return f"{first.message} — {first.fix}" if first is not None else plan.reason


def local_planner(
    host: HostFacts, n: int, spec: ModelSpec, context: int, prompt_tokens: int
) -> BenchPlanner:
    def plan(k: int, strategy: str, calibration: Calibration | None) -> tuple[Plan, dict[str, Any]]:
        from launcher.planning.cluster_plan import local_share_rates  # measures: only when run

        p = plan_local(
            host, k, spec, strategy=strategy, context=context, calibration=calibration,
            prompt_tokens=prompt_tokens, share_rates=local_share_rates(spec, k, strategy),
        )  # fmt: skip
        return p, hostfile_json(p) if p.ok else {}

    return BenchPlanner(plan, n)


def cluster_planner(
    cluster: ClusterSpec,
    facts: Sequence[HostFacts],
    spec: ModelSpec,
    backend: str,
    context: int,
    prompt_tokens: int,
) -> BenchPlanner:
    def plan(k: int, strategy: str, calibration: Calibration | None) -> tuple[Plan, dict[str, Any]]:
        result = check(facts[:k], backend)
        p = plan_cluster(
            result, spec, strategy=strategy, backend=backend, context=context,
            calibration=calibration, prompt_tokens=prompt_tokens,
        )  # fmt: skip
        return p, hostfile_json(p, result.links, cluster.env) if p.ok else {}

    return BenchPlanner(plan, len(cluster.hosts), cluster, tuple(facts))


def plan_cases(
    planner: BenchPlanner, sizes: Sequence[int], strategies: Sequence[str]
) -> list[Case]:
    out = []
    for k in sizes:
        groups = [tuple(strategies)] if k == 1 else [(s,) for s in strategies]
        out += [planner.case(k, group) for group in groups]
    return out


def _jobs(
    target: LaunchTarget,
    model: str,
    mode: str,
    options: dict[str, Any],
    seed: int,
    deadlines: Deadlines,
) -> list[RankJob]:
    """The same jobs `launch` would start, in a measurement mode with its options."""
    jobs = build_rank_jobs(
        target.hostfile,
        strategy=target.plan.strategy,
        model=model,
        generation=Generation(prompt="", seed=seed),
        layer_split=target.plan.layer_split,
        tensor_shares=[r.tensor_share for r in target.plan.ranks],
        port=target.port,
        deadlines=deadlines,
    )
    return [replace(j, mode=mode, options=dict(options)) for j in jobs]


def run_case(
    target: LaunchTarget, model: str, settings: BenchSettings, deadlines: Deadlines
) -> Outcome:
    """Every rank of one bench run, supervised as `launch` supervises them."""
    jobs = _jobs(target, model, "bench", settings.options(), settings.seed, deadlines)
    return _supervise(target, model, jobs, deadlines)


def _supervise(
    target: LaunchTarget, model: str, jobs: list[RankJob], deadlines: Deadlines
) -> Outcome:
    """Supervise the jobs, the model's files offered to ranks on other hosts meanwhile."""
    with ModelShare(model) as share:
        launches = rank_launches(target, share.jobs(target, jobs))
        return supervise(launches, lambda _text: None, None, deadlines)


@dataclass(frozen=True)
class CalibrationRun:
    outcome: Outcome
    calibration: Calibration | None  # None when the run failed


def _step_times(result: dict[str, Any]) -> StepTimes | None:
    """The mini model's per-token times a calibrating rank 0 reported (step_cost.py)."""
    if "step_layers" not in result:
        return None
    return StepTimes(
        int(result["step_layers"]), float(result["alone_s"]), float(result["tensor_s"]),
        float(result["pipeline_s"]),
    )  # fmt: skip


def cost_name(target: LaunchTarget) -> str:
    """The planner's name for the link the ranks use (topology.chips.BACKENDS)."""
    return "ring-local" if target.plan.local else target.backend


def run_calibration(
    target: LaunchTarget, model: str, spec: ModelSpec, large_bytes: int, deadlines: Deadlines
) -> CalibrationRun:
    """All-reduce timings over the target's ranks and one memory bandwidth per machine."""
    hosts = [r.host for r in target.plan.ranks]
    first_rank = {h: hosts.index(h) for h in dict.fromkeys(hosts)}
    options = {
        "small_bytes": spec.hidden * spec.dtype_bytes,  # one token's hidden state
        "dtype": spec.activation_dtype,
        "large_bytes": large_bytes,
        "bandwidth_ranks": sorted(first_rank.values()),
    }
    jobs = _jobs(target, model, "calibrate", options, 0, deadlines)
    outcome = _supervise(target, model, jobs, deadlines)
    if outcome.exit_code != 0 or outcome.result is None:
        return CalibrationRun(outcome, None)
    r = outcome.result
    links: tuple[LinkMeasurement, ...] = ()
    if len(hosts) > 1:
        links = (
            LinkMeasurement(
                cost_name(target), len(hosts), int(r["small_bytes"]), float(r["small_s"]),
                int(r["large_bytes"]), float(r["large_s"]), _step_times(r),
            ),
        )  # fmt: skip
    measured = r["memory_bandwidth_gbs"]
    bandwidths = tuple((h, float(measured[rank])) for h, rank in first_rank.items())
    return CalibrationRun(outcome, Calibration(links, bandwidths))
