"""macOS builds, software versions (versions.txt) and unsafe settings, on 2–8 host snapshots."""

from __future__ import annotations

import pytest
import synth

from topology.facts import CheckResult, Problem
from topology.host_facts import host_facts
from topology.parse import ParseError, parse_versions
from topology.problems import check

SAME = {"python": "3.12.7", "mlx": "0.32.2", "mlx-lm": "0.32.2", "mlx-cluster": "0.1.0"}


def only(result: CheckResult, code: str) -> list[Problem]:
    return [p for p in result.problems if p.code == code]


def with_versions(c: synth.Cluster, **per_host: dict[str, str | None]) -> synth.Cluster:
    for h in c.hosts:
        h.versions = {**SAME, **per_host.get(h.name.replace("-", "_"), {})}
    return c


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_same_product_version_other_build_is_a_macos_mismatch(n: int) -> None:
    c = synth.ring(n)
    c.host("studio-b").build = "25C5048a"  # a beta of 26.2
    result = check(c.facts())
    [p] = only(result, "macos_mismatch")
    assert p.hosts == ("studio-b",) and p.severity == "error"
    assert "builds differ" in p.message and "studio-b 25C5048a" in p.message
    assert "betas included" in p.message and "build 25C56" in p.fix
    assert result.backend == "ring"
    assert check(c.facts(), "ring").ok


def test_26_2_with_26_3_names_the_buffer_change() -> None:
    c = synth.mesh(2)
    c.host("studio-a").macos = "26.3"
    [p] = only(check(c.facts()), "macos_mismatch")
    assert p.hosts == ("studio-b",) and "mlx #3094" in p.message and "26.3" in p.fix


def test_one_build_everywhere_is_fine() -> None:
    assert only(check(synth.mesh(3).facts()), "macos_mismatch") == []


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("package", ["mlx", "mlx-lm", "mlx-cluster"])
def test_a_different_package_version_is_an_error(n: int, package: str) -> None:
    c = with_versions(synth.ring(n), studio_b={package: "0.0.9"})
    result = check(c.facts())
    [p] = only(result, "software_mismatch")
    assert p.severity == "error" and p.hosts == ("studio-b",)
    assert package in p.message and "studio-b 0.0.9" in p.message
    assert not result.ok and result.backend is None  # no backend runs mismatched ranks
    assert not check(c.facts(), "ring").ok


def test_only_the_python_minor_version_is_a_warning() -> None:
    c = with_versions(synth.mesh(3), studio_c={"python": "3.11.9"})
    result = check(c.facts())
    [p] = only(result, "software_mismatch")
    assert p.severity == "warning" and p.hosts == ("studio-c",) and "3.11.9" in p.message
    assert result.ok and result.backend == "jaccl"
    patch = with_versions(synth.mesh(3), studio_c={"python": "3.12.1"})
    assert only(check(patch.facts()), "software_mismatch") == []


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("package", ["mlx", "mlx-cluster"])
def test_a_python_without_mlx_or_mlx_cluster_is_software_missing(n: int, package: str) -> None:
    c = with_versions(synth.ring(n), studio_a={package: None})
    result = check(c.facts())
    [p] = only(result, "software_missing")
    assert p.hosts == ("studio-a",) and p.severity == "error" and f"no {package}" in p.message
    assert "pip install" in p.fix
    assert only(result, "software_mismatch") == []  # missing is said once, as missing
    assert not result.ok and result.backend is None


def test_mlx_lm_missing_on_one_host_is_a_mismatch() -> None:
    c = with_versions(synth.mesh(2), studio_b={"mlx-lm": None})
    [p] = only(check(c.facts()), "software_mismatch")
    assert p.hosts == ("studio-b",) and "studio-b not installed" in p.message


def test_a_python_that_does_not_run_is_software_missing() -> None:
    files = synth.mesh(2).files()["studio-a"]
    files["versions.txt.error"] = (
        "`/opt/none/bin/python -c <versions script>` failed (exit 127): sh: 1: "
        "/opt/none/bin/python: not found\n"
    )
    facts = host_facts("studio-a", files)
    assert facts.software is not None and facts.software.error is not None
    [p] = only(check([facts]), "software_missing")
    assert "did not run" in p.message and "/opt/none/bin/python" in p.message


def test_without_versions_txt_there_is_nothing_to_compare() -> None:
    c = synth.mesh(3)
    c.host("studio-a").versions = dict(SAME)  # one host only: no pair to compare
    result = check(c.facts())
    assert result.ok and not {"software_mismatch", "software_missing"} & {
        p.code for p in result.problems
    }
    assert [h.software is None for h in c.facts()] == [False, True, True]


def test_versions_txt_parsing() -> None:
    sw = parse_versions("python 3.12.7\nmlx 0.32.2\nmlx-lm -\n\nmlx-cluster 0.2.0\n")
    assert sw.version("mlx") == "0.32.2" and sw.version("mlx-lm") is None
    assert sw.has("mlx-lm") and not sw.has("torch")
    for bad in ("", "mlx\n", "mlx 0.1 extra\n", "mlx 0.1\nmlx 0.2\n", "ml$x 1\n", "mlx 1;rm\n"):
        with pytest.raises(ParseError):
            parse_versions(bad)


def test_garbage_versions_txt_is_a_probe_warning_only() -> None:
    c = synth.mesh(2)
    c.host("studio-a").versions = dict(SAME)
    c.host("studio-a").garbage = frozenset({"versions.txt"})
    result = check(c.facts())
    [p] = only(result, "probe_missing")
    assert p.severity == "warning" and "versions.txt" in p.message and result.ok
    assert "topology snapshot" in p.fix


@pytest.mark.parametrize(("n", "value"), [(2, "1"), (5, "true"), (8, "1")])
def test_fast_synch_in_the_cluster_env_is_a_warning(n: int, value: str) -> None:
    facts = synth.ring(n).facts()
    result = check(facts, "jaccl-ring", env=[f"MLX_METAL_FAST_SYNCH={value}", "OTHER=1"])
    [p] = only(result, "fast_synch_unsafe")
    assert p.severity == "warning" and result.ok and p.hosts == tuple(synth.names(n))
    assert "mlx #3142" in p.message and "#3830" in p.message and "PR #4005" in p.message
    assert p.fix == f"Remove MLX_METAL_FAST_SYNCH={value} from `env:` in the cluster file."
    assert only(check(facts, env=["MLX_METAL_FAST_SYNCH=0"]), "fast_synch_unsafe") == []
