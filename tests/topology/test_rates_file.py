"""rates.json (`python -m cluster.microbench`'s output) in a host's files -> HostFacts.rates: an
optional file, so missing or failed means no rates and no problem; unparsable is a probe gap,
never a crash; `topology check --json` shows what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import synth

from launcher.hosts.snapshots import load_snapshot, read_host_files, write_snapshot
from topology.facts import RATES_FILE, HostFacts
from topology.host_facts import host_facts
from topology.problems import check
from topology.report import check_json

MEASURED = {
    "copy_gbs": 6.2,
    "matmul_gflops": {
        "float32": {"1": 2.7, "8": 16.6, "512": 74.2},
        "q4": {"1": 0.15, "8": 0.18, "512": 0.13},
    },
    "device": "cpu",
    "source": "measured",
    "blas": "openblas 0.3.21, 1 thread (/usr/lib/x86_64-linux-gnu/libopenblas.so.0)",
}


def _files(rates: str | None, error: str | None = None) -> dict[str, str | None]:
    files = synth.cluster(1, linux=True, prefix="box").files()["box-a"]
    return {**files, RATES_FILE: rates, RATES_FILE + ".error": error}


def _rates_gaps(h: HostFacts) -> list[tuple[str, str]]:
    return [(g.file, g.reason.split(":")[0]) for g in h.gaps if g.file == RATES_FILE]


def test_recorded_rates_become_the_hosts_rates() -> None:
    h = host_facts("box-a", _files(json.dumps(MEASURED) + "\n"))
    assert h.rates is not None and _rates_gaps(h) == []
    assert (h.rates.copy_gbs, h.rates.device) == (6.2, "cpu")
    assert h.rates.matmul_gflops == {
        "float32": {1: 2.7, 8: 16.6, 512: 74.2},
        "q4": {1: 0.15, 8: 0.18, 512: 0.13},
    }
    [shown] = check_json(check([h], "ring"))["hosts"]  # type: ignore[index]
    assert shown["rates"]["matmul_gflops"]["float32"] == {"1": 2.7, "8": 16.6, "512": 74.2}


def test_a_mac_records_its_gpu_rates_too() -> None:
    files = synth.mesh(2).files()["studio-a"]
    gpu = {**MEASURED, "device": "gpu"}
    h = host_facts("studio-a", {**files, RATES_FILE: json.dumps(gpu)})
    assert h.is_mac and h.rates is not None and h.rates.device == "gpu" and h.gaps == ()


def test_not_recorded_or_failed_is_no_rates_and_no_problem() -> None:
    missing = host_facts("box-a", _files(None))
    error = "`python -m cluster.microbench` failed (exit 1): No module named 'mlx'\n"
    failed = host_facts("box-a", _files(None, error))
    for h in (missing, failed):
        assert h.rates is None and _rates_gaps(h) == []
        assert "rates" not in check_json(check([h], "ring"))["hosts"][0]  # type: ignore[index]
    assert check([failed], "ring").problems == check([missing], "ring").problems


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{ garbage\n",
        "[" * 100_000,  # nested past any limit: refused before json recurses into it
        '{"copy_gbs": 5}',  # no matmul table
        json.dumps({**MEASURED, "copy_gbs": -1}),
        json.dumps({**MEASURED, "copy_gbs": "fast"}),
        json.dumps({**MEASURED, "device": "npu"}),
        json.dumps({**MEASURED, "matmul_gflops": {"int3": {"1": 1.0}}}),
        json.dumps({**MEASURED, "matmul_gflops": {"q4": {"one": 1.0}}}),
        '{"copy_gbs": 1, "matmul_gflops": {"q4": {"1": 1e400}}}',  # infinite
        '{"copy_gbs": NaN, "matmul_gflops": {"q4": {"1": 1}}}',
    ],
)
def test_unparsable_rates_are_a_probe_gap_never_a_crash(text: str) -> None:
    h = host_facts("box-a", _files(text))
    assert h.rates is None and _rates_gaps(h) == [(RATES_FILE, "unparsable")]


def test_rates_json_survives_a_snapshot_round_trip(tmp_path: Path) -> None:
    text = json.dumps(MEASURED) + "\n"
    files = {"box-a": _files(text)}
    write_snapshot(tmp_path / "snap", files)
    assert read_host_files(tmp_path / "snap" / "box-a")[RATES_FILE] == text
    [h] = load_snapshot(tmp_path / "snap")
    assert h.rates is not None and h.rates.gflops("float32", 512) == 74.2
