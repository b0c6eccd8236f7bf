"""Plans from real inputs: a cluster file (probed live), a snapshot, or this machine (--local N).

The I/O around topology.planning.plan: probing, reading snapshots, finding this machine's
memory, chip and measured rates.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.planning.calibration_store import load_calibration
from launcher.planning.local_rates import layer_shapes, local_rates, tensor_share_rates
from launcher.planning.model_source import load_model_spec
from topology.cluster_file import ClusterSpec
from topology.facts import CheckResult, HostFacts, Software
from topology.host_rates import HostRates
from topology.model.spec import ModelSpec
from topology.planning.hostfile import hostfile_json
from topology.planning.plan import LOCAL_IP, Plan, plan_cluster, plan_local
from topology.planning.prefill import DEFAULT_PROMPT_TOKENS
from topology.problems import check

_SYSCTL_TIMEOUT_S = 5.0
_MIB = 1 << 20
TEST_WIRED_LIMIT_ENV = "MLX_CLUSTER_TEST_WIRED_LIMIT_MB"


def _sysctl(name: str) -> str | None:
    """`sysctl -n name` on macOS; None elsewhere or on any failure."""
    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=_SYSCTL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def this_machine() -> HostFacts:
    """This machine's memory (and on a Mac its chip and GPU wired limit), for --local N."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # Test-only: a small wired limit (in MB, as the sysctl gives it) for --local N, so tests can
    # serve under a tight memory budget; users set `sysctl iogpu.wired_limit_mb` or wired_limit_gb.
    wired = os.environ.get(TEST_WIRED_LIMIT_ENV) or _sysctl("iogpu.wired_limit_mb")
    wired_bytes = int(wired) * _MIB if wired and wired.isdigit() and int(wired) > 0 else None
    return HostFacts(
        name="localhost",
        ssh=LOCAL_IP,
        ips=(LOCAL_IP,),
        chip=_sysctl("machdep.cpu.brand_string"),
        memory_bytes=int(memory),
        is_mac=platform.system() == "Darwin",
        wired_limit_bytes=wired_bytes,
    )


def measured_machine(spec: ModelSpec | None = None) -> HostFacts:
    """this_machine() with its measured rates (cached after the first time: local_rates.py),
    the decode rates of its float kind timed on the matrices of `spec` when given."""
    rates = local_rates(layer_shapes(spec), spec.activation_dtype) if spec else local_rates()
    return replace(this_machine(), rates=rates)


def local_share_rates(spec: ModelSpec, n: int, strategy: str) -> HostRates | None:
    """The rates a tensor rank of `n` here multiplies its share at, when tensor may be planned."""
    return None if strategy == "pipeline" else tensor_share_rates(spec, n)


def empty_hostfile(plan: Plan) -> dict[str, Any]:
    return {"backend": plan.backend or "ring", "envs": [], "hosts": []}


def plan_for_facts(
    facts: Sequence[HostFacts],
    spec: ModelSpec,
    *,
    strategy: str = "auto",
    backend: str = "auto",
    context: int | None = None,  # None: the default, capped at the model's context
    envs: Sequence[str] = (),
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,  # the prompt TTFT is predicted for
) -> tuple[Plan, dict[str, Any]]:
    """Check the hosts, plan, and the mlx.launch hostfile (no hosts when there is no plan)."""
    _, plan, hostfile = checked_plan_for_facts(
        facts, spec, strategy=strategy, backend=backend, context=context, envs=envs,
        prompt_tokens=prompt_tokens,
    )  # fmt: skip
    return plan, hostfile


def checked_plan_for_facts(
    facts: Sequence[HostFacts],
    spec: ModelSpec,
    *,
    strategy: str = "auto",
    backend: str = "auto",
    context: int | None = None,
    envs: Sequence[str] = (),
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[CheckResult, Plan, dict[str, Any]]:
    """plan_for_facts, with the check it planned from (serve shows it on its dashboard)."""
    result = check(facts, backend, envs)
    plan = plan_cluster(
        result, spec, strategy=strategy, backend=backend, context=context,
        calibration=load_calibration(),  # bench --calibrate's numbers, when saved
        prompt_tokens=prompt_tokens,
    )  # fmt: skip
    if not plan.ok:
        return result, plan, empty_hostfile(plan)
    return result, plan, hostfile_json(plan, result.links, envs)


def plan_for_cluster(
    spec: ClusterSpec,
    model: str,
    *,
    strategy: str = "auto",
    backend: str = "auto",
    context: int | None = None,  # None: the default, capped at the model's context
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[Plan, dict[str, Any]]:
    """Probe a cluster file's hosts live, check and plan (used by `plan` and `launch`)."""
    _, plan, hostfile = checked_plan_for_cluster(
        spec, model, strategy=strategy, backend=backend, context=context,
        prompt_tokens=prompt_tokens,
    )  # fmt: skip
    return plan, hostfile


def checked_plan_for_cluster(
    spec: ClusterSpec,
    model: str,
    *,
    strategy: str = "auto",
    backend: str = "auto",
    context: int | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[CheckResult, Plan, dict[str, Any]]:
    """plan_for_cluster, with the check it planned from."""
    from launcher.hosts.gather import probe_facts

    model_spec = load_model_spec(model)
    facts = probe_facts(spec)
    return checked_plan_for_facts(
        facts, model_spec, strategy=strategy, backend=backend, context=context, envs=spec.env,
        prompt_tokens=prompt_tokens,
    )  # fmt: skip


def plan_for_snapshot(
    directory: Path,
    model_spec: ModelSpec,
    *,
    strategy: str,
    backend: str,
    context: int | None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[Plan, dict[str, Any]]:
    from launcher.hosts.snapshots import load_snapshot

    return plan_for_facts(
        load_snapshot(directory), model_spec, strategy=strategy, backend=backend, context=context,
        prompt_tokens=prompt_tokens,
    )  # fmt: skip


def plan_for_local(
    n: int,
    model_spec: ModelSpec,
    *,
    strategy: str,
    context: int | None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[Plan, dict[str, Any]]:
    plan = plan_local(
        measured_machine(model_spec), n, model_spec, strategy=strategy, context=context,
        calibration=load_calibration(),  # bench --calibrate's numbers, when saved
        prompt_tokens=prompt_tokens, share_rates=local_share_rates(model_spec, n, strategy),
    )  # fmt: skip
    if not plan.ok:
        return plan, empty_hostfile(plan)
    return plan, hostfile_json(plan)


def this_software() -> Software:
    """The versions this interpreter has (what versions.txt records for a probed host): the
    ranks of --local N run on this very interpreter."""
    versions: list[tuple[str, str | None]] = [("python", platform.python_version())]
    for name in ("mlx", "mlx-lm", "mlx-cluster"):
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((name, None))
    return Software(tuple(versions))


def checked_plan_for_local(
    n: int, model_spec: ModelSpec, *, strategy: str, context: int | None
) -> tuple[CheckResult, Plan, dict[str, Any]]:
    """plan_for_local, with this machine checked as `topology check` would (serve's dashboard)."""
    host = replace(measured_machine(model_spec), software=this_software())
    plan = plan_local(
        host, n, model_spec, strategy=strategy, context=context,
        calibration=load_calibration(), share_rates=local_share_rates(model_spec, n, strategy),
    )  # fmt: skip
    result = check([host], "ring")
    if not plan.ok:
        return result, plan, empty_hostfile(plan)
    return result, plan, hostfile_json(plan)
