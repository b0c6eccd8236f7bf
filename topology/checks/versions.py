"""Version drift between hosts (macOS versions and builds, mlx, mlx-lm, mlx-cluster, Python),
missing software, and settings known to be unsafe.

macOS must match exactly, betas included (exo README, exo PR #1316): jaccl uses buffers larger
than 4 KB only from 26.3 (mlx #3094), so 26.2 and 26.3 in one cluster disagree. Ranks that load
different mlx or mlx-lm versions fail in ways nobody can read, so those are errors; a different
Python minor version alone is a warning.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from topology.facts import Backend, HostFacts
from topology.finding import ALL_BACKENDS, NO_BACKEND, Finding

SOFTWARE_UPDATE = "System Settings → General → Software Update"
PACKAGES = ("mlx", "mlx-lm", "mlx-cluster")  # must be identical on every host
NEEDED = ("mlx", "mlx-cluster")  # without these the configured python cannot run a rank
UNSAFE_ENV = "MLX_METAL_FAST_SYNCH"
JACCL_BIG_BUFFERS = (26, 3)  # jaccl sends buffers above 4 KB only from this macOS (mlx #3094)


def version_key(v: str) -> tuple[tuple[int, str], ...]:
    """'0.32.10' > '0.32.9'; numbers compare as numbers, anything else as text after them."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.+-]", v))


def _listed(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {value}" for name, value in pairs)


def _majority(values: dict[str, str], newest: bool) -> str:
    """The version hosts should converge on: the newest, or the build most hosts run."""
    if newest:
        return max(values.values(), key=version_key)
    counts = Counter(values.values())
    return max(values.values(), key=lambda v: (counts[v], -list(values.values()).index(v)))


def macos_findings(macs: Sequence[HostFacts], rdma: frozenset[Backend]) -> list[Finding]:
    """macos_mismatch: different versions, or one version in different builds."""
    versions = {h.name: h.macos for h in macs if h.macos}
    if len(set(versions.values())) > 1:
        newest = _majority(versions, newest=True)
        behind = tuple(n for n, v in versions.items() if v != newest)
        message = f"macOS versions differ ({_listed(list(versions.items()))}); RDMA peers must run "
        message += "the same version"
        keys = {version_key(v)[:2] for v in versions.values()}
        big = ((JACCL_BIG_BUFFERS[0], ""), (JACCL_BIG_BUFFERS[1], ""))
        if min(keys) < big <= max(keys):
            message += " (jaccl uses buffers above 4 KB only from macOS 26.3, mlx #3094)"
        fix = f"Update {', '.join(behind)} to macOS {newest} ({SOFTWARE_UPDATE})."
        return [Finding("macos_mismatch", behind, message, fix, rdma)]
    builds = {h.name: h.macos_build for h in macs if h.macos and h.macos_build}
    if len(set(builds.values())) < 2:
        return []
    common = _majority(builds, newest=False)
    behind = tuple(n for n, b in builds.items() if b != common)
    version = next(iter(versions.values()))
    message = (
        f"every Mac runs macOS {version} but the builds differ ({_listed(list(builds.items()))}); "
        "RDMA peers must run the identical build, betas included"
    )
    fix = (
        f"Install build {common} on {', '.join(behind)} ({SOFTWARE_UPDATE}; a beta build leaves "
        "only by installing the release, after leaving the beta programme)."
    )
    return [Finding("macos_mismatch", behind, message, fix, rdma)]


def _missing(h: HostFacts) -> Finding | None:
    sw = h.software
    if sw is None:
        return None
    if sw.error is not None:
        what = f"the configured python did not run ({sw.error})"
    else:
        lacking = [p for p in NEEDED if sw.has(p) and sw.version(p) is None]
        if not lacking:
            return None
        what = f"the configured python has no {' and no '.join(lacking)}"
    return Finding(
        "software_missing",
        (h.name,),
        f"{h.name}: {what}; no rank can start there",
        f"On {h.name}, install mlx-cluster into the python the cluster file names (`python:`, "
        "else python3): `python3 -m venv ~/mlx-cluster && ~/mlx-cluster/bin/pip install "
        "./mlx-cluster`, then set `python: ~/mlx-cluster/bin/python` for it.",
        ALL_BACKENDS,
    )


def _package_drift(hosts: Sequence[HostFacts], package: str) -> Finding | None:
    shown = {
        h.name: h.software.version(package) or "not installed"
        for h in hosts
        if h.software is not None and h.software.has(package)
    }
    if package in NEEDED:  # a host without it is software_missing already
        shown = {n: v for n, v in shown.items() if v != "not installed"}
    if len(set(shown.values())) < 2:
        return None
    installed = {n: v for n, v in shown.items() if v != "not installed"}
    newest = _majority(installed, newest=True)
    behind = tuple(n for n, v in shown.items() if v != newest)
    pin = "mlx-cluster from the same commit" if package == "mlx-cluster" else f"{package}=={newest}"
    return Finding(
        "software_mismatch",
        behind,
        f"{package} differs across hosts ({_listed(list(shown.items()))}); ranks built from "
        "different versions fail in ways that name nothing",
        f"Install {pin} on {', '.join(behind)} (into the python the cluster file names), so every "
        "host runs the same version.",
        ALL_BACKENDS,
    )


def _python_drift(hosts: Sequence[HostFacts]) -> Finding | None:
    full = {
        h.name: v
        for h in hosts
        if h.software is not None and (v := h.software.version("python")) is not None
    }
    minor = {n: ".".join(v.split(".")[:2]) for n, v in full.items()}
    if len(set(minor.values())) < 2:
        return None
    newest = _majority(minor, newest=True)
    behind = tuple(n for n, v in minor.items() if v != newest)
    return Finding(
        "software_mismatch",
        behind,
        f"Python differs across hosts ({_listed(list(full.items()))}); the same mlx works, but "
        "wheels and behaviour can differ",
        f"Use Python {newest} on {', '.join(behind)} too (a venv made with python{newest}).",
        NO_BACKEND,
    )


def software_findings(hosts: Sequence[HostFacts]) -> list[Finding]:
    """software_missing per host; software_mismatch across hosts (versions.txt only)."""
    found = [f for h in hosts if (f := _missing(h)) is not None]
    for package in PACKAGES:
        if (drift := _package_drift(hosts, package)) is not None:
            found.append(drift)
    if (py := _python_drift(hosts)) is not None:
        found.append(py)
    return found


def env_findings(env: Sequence[str], hosts: Sequence[HostFacts]) -> list[Finding]:
    """fast_synch_unsafe when the cluster file's `env` turns MLX_METAL_FAST_SYNCH on."""
    found = []
    for item in env:
        name, _, value = item.partition("=")
        if name == UNSAFE_ENV and value not in ("", "0"):
            found.append(
                Finding(
                    "fast_synch_unsafe",
                    tuple(h.name for h in hosts),
                    f"the cluster file sets {item} for every rank: it can deadlock and leave "
                    "the GPU wedged until a reboot (mlx #3142, #3830); mlx's docs no longer "
                    "suggest it (mlx PR #4005)",
                    f"Remove {item} from `env:` in the cluster file.",
                    NO_BACKEND,
                )
            )
    return found
