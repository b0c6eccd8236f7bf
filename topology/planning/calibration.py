"""Measured numbers that replace the planner's published constants (bench --calibrate).

Two kinds: an all-reduce measured at a small (decode-sized) and a large message size on one
backend, which pins down that backend's per-hop latency and link bandwidth in BackendCost's
model; and each host's memory bandwidth, timed as a large array reduction in MLX. Pure: the
launcher reads/writes the JSON file (launcher/planning/calibration_store.py) and passes a
Calibration in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from topology.chips import BackendCost
from topology.cluster_file import BANDWIDTH_GBS
from topology.untrusted import show


@dataclass(frozen=True)
class LinkMeasurement:
    """All-reduce times over `ranks` ranks on the backend the planner calls `cost_name`."""

    cost_name: str  # a key of topology.chips.BACKENDS: ring-local for --local N
    ranks: int
    small_bytes: int
    small_s: float
    large_bytes: int
    large_s: float
    # A mini model's decode, seconds a token (cluster/bench/step_cost.py): whole on one rank, in
    # tensor shares and in pipeline stages over these ranks; None in files from before.
    steps: StepTimes | None = None

    def fit(self, base: BackendCost) -> BackendCost:
        """base with hop_s and link_bytes_per_s solved from the two measured points.

        BackendCost models an all-reduce as steps·hop + wire·size/bandwidth, with steps = 2 and
        wire = 1 for a mesh, steps = 2(n-1) and wire = steps/n for a ring algorithm. Where the
        mini model's steps were timed, hop_s is what an all-reduce costs inside a tensor step
        (its share of the step's time beyond the whole model's; the bytes are negligible) and
        the pipeline step's cost is what the stages took beyond the whole model.
        """
        n = max(self.ranks, 2)
        steps = 2 if base.mesh else 2 * (n - 1)
        wire = 1.0 if base.mesh else steps / n
        extra_bytes = self.large_bytes - self.small_bytes
        extra_s = self.large_s - self.small_s
        bandwidth = base.link_bytes_per_s
        if extra_bytes > 0 and extra_s > 0:
            bandwidth = wire * extra_bytes / extra_s
        hop = max(0.0, (self.small_s - wire * self.small_bytes / bandwidth) / steps)
        if self.steps is None:
            return replace(base, hop_s=hop, link_bytes_per_s=bandwidth)
        t = self.steps
        in_step = max(0.0, t.tensor_s - t.alone_s) / (2 * t.layers) / steps
        return replace(
            base, hop_s=in_step, link_bytes_per_s=bandwidth,
            pipeline_step_s=max(0.0, t.pipeline_s - t.alone_s),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cost_name": self.cost_name,
            "ranks": self.ranks,
            "small_bytes": self.small_bytes,
            "small_s": self.small_s,
            "large_bytes": self.large_bytes,
            "large_s": self.large_s,
        }
        if self.steps is not None:
            out["steps"] = self.steps.to_json()
        return out


@dataclass(frozen=True)
class StepTimes:
    """Seconds a token of the calibration's mini model (`layers` layers): whole on one rank,
    in tensor shares, in pipeline stages."""

    layers: int
    alone_s: float
    tensor_s: float
    pipeline_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> StepTimes:
        if not isinstance(raw, Mapping):
            raise TypeError("steps must be an object")
        return cls(
            layers=int(_in(raw["layers"], "steps.layers", 1, 4096)),
            alone_s=_in(raw["alone_s"], "steps.alone_s", *_SECONDS),
            tensor_s=_in(raw["tensor_s"], "steps.tensor_s", *_SECONDS),
            pipeline_s=_in(raw["pipeline_s"], "steps.pipeline_s", *_SECONDS),
        )


@dataclass(frozen=True)
class Calibration:
    links: tuple[LinkMeasurement, ...] = ()
    host_bandwidth_gbs: tuple[tuple[str, float], ...] = ()  # (host name, measured GB/s)

    def cost(self, name: str, base: BackendCost, ranks: int | None = None) -> BackendCost:
        """The backend's cost fitted to its measurement over `ranks` ranks, else over the most
        ranks measured; base when the backend was not measured. What a step waits for changes
        with the ranks: 3 local ranks on 2 cores took 0.19 ms a ring hop, 2 ranks on a core
        each far less."""
        link = self.link(name, ranks)
        return base if link is None else link.fit(base)

    def link(self, name: str, ranks: int | None = None) -> LinkMeasurement | None:
        """The backend's measurement over `ranks` ranks, else the one over the most ranks."""
        measured = [k for k in self.links if k.cost_name == name]
        same = [k for k in measured if k.ranks == ranks]
        return same[0] if same else max(measured, key=lambda k: k.ranks, default=None)

    def bandwidth(self, host: str) -> float | None:
        return dict(self.host_bandwidth_gbs).get(host)

    def merged(self, newer: Calibration) -> Calibration:
        """This calibration with every backend (at each rank count) and host that `newer`
        measured replaced."""
        links = {(k.cost_name, k.ranks): k for k in self.links}
        links |= {(k.cost_name, k.ranks): k for k in newer.links}
        hosts = dict(self.host_bandwidth_gbs) | dict(newer.host_bandwidth_gbs)
        return Calibration(tuple(links.values()), tuple(sorted(hosts.items())))

    def to_json(self) -> dict[str, Any]:
        return {
            "links": [k.to_json() for k in self.links],
            "host_bandwidth_gbs": dict(self.host_bandwidth_gbs),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Calibration:
        """Read back to_json's output; KeyError/TypeError/ValueError on anything else."""
        links_raw, hosts = raw["links"], raw["host_bandwidth_gbs"]
        if not isinstance(links_raw, list) or len(links_raw) > _MAX_ENTRIES:
            raise TypeError(f"links must be a list of at most {_MAX_ENTRIES} measurements")
        if not isinstance(hosts, Mapping) or len(hosts) > _MAX_ENTRIES:
            raise TypeError("host_bandwidth_gbs must be an object of host: GB/s")
        links = tuple(_link(k) for k in links_raw)
        names = [_name(h, "host_bandwidth_gbs") for h in hosts]
        bandwidths = tuple(sorted((h, _in(hosts[h], f"{h}: GB/s", *BANDWIDTH_GBS)) for h in names))
        return cls(links, bandwidths)


# A calibration file is read back from disk: its numbers are checked like any untrusted input,
# to ranges no measurement leaves, before the planner divides by them.
_MAX_ENTRIES = 256
_BYTES = (1.0, float(1 << 40))
_SECONDS = (1e-9, 3600.0)


def _in(value: Any, key: str, lo: float, hi: float) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if not ok or not lo <= value <= hi:  # nan and inf fail the comparison
        raise ValueError(f"{key}: must be a number from {lo:g} to {hi:g}, got {show(value)}")
    return float(value)


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
        raise ValueError(f"{key}: {show(value)} is not a name")
    return value


def _link(k: Any) -> LinkMeasurement:
    if not isinstance(k, Mapping):
        raise TypeError("each link must be an object")
    return LinkMeasurement(
        cost_name=_name(k["cost_name"], "cost_name"),
        ranks=int(_in(k["ranks"], "ranks", 2, 4096)),
        small_bytes=int(_in(k["small_bytes"], "small_bytes", *_BYTES)),
        small_s=_in(k["small_s"], "small_s", *_SECONDS),
        large_bytes=int(_in(k["large_bytes"], "large_bytes", *_BYTES)),
        large_s=_in(k["large_s"], "large_s", *_SECONDS),
        steps=StepTimes.from_json(k["steps"]) if "steps" in k else None,
    )


def calibrated_cost(
    name: str, base: BackendCost, calibration: Calibration | None, ranks: int | None = None
) -> BackendCost:
    return base if calibration is None else calibration.cost(name, base, ranks)


def calibrated_bandwidth(host: str, calibration: Calibration | None) -> float | None:
    return None if calibration is None else calibration.bandwidth(host)


def calibration_notes(
    calibration: Calibration | None, hosts: list[str], cost_name: str, ranks: int | None = None
) -> list[str]:
    """What a plan took from the calibration, for its assumptions list (`ranks`: of the plan,
    where several share a host)."""
    if calibration is None:
        return []
    notes = [
        f"memory bandwidth of {h}: {gbs:.1f} GB/s as measured by `mlx-cluster bench --calibrate`"
        for h in dict.fromkeys(hosts)
        if (gbs := calibration.bandwidth(h)) is not None
    ]
    link = calibration.link(cost_name, ranks or len(hosts))
    if link is not None and (ranks or len(hosts)) > 1:
        notes.append(
            f"{cost_name} all-reduce cost fitted to a measurement over {link.ranks} ranks "
            f"({link.small_s * 1e6:.0f} µs at {link.small_bytes} B, "
            f"{link.large_s * 1e3:.1f} ms at {link.large_bytes / 2**20:.0f} MiB)"
        )
        if link.steps is not None:
            t = link.steps
            notes.append(
                f"{cost_name} step costs measured on a {t.layers}-layer mini model over "
                f"{link.ranks} ranks: {(t.tensor_s - t.alone_s) * 1e3:.2f} ms a tensor step, "
                f"{(t.pipeline_s - t.alone_s) * 1e3:.2f} ms a pipeline step beyond its compute"
            )
    return notes
