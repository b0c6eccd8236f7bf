"""`mlx-cluster topology check|snapshot` run for real (subprocess): exit codes, output, errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import synth
from paths import MLX_CLUSTER, ROOT

from topology.host_rates import parse_rates

CLI = str(MLX_CLUSTER)
SNAPSHOTS = ROOT / "hostfiles" / "snapshots"


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx-cluster: error: "), done.stderr
    return lines[0]


def test_example_mesh_is_ready() -> None:
    done = run("topology", "check", "--snapshot", SNAPSHOTS / "mesh-4x-m3-ultra")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Verdict: ready for jaccl (full RDMA mesh over 4 hosts)." in done.stdout
    obj = json.loads(
        run("topology", "check", "--snapshot", SNAPSHOTS / "mesh-4x-m3-ultra", "--json").stdout
    )
    assert obj["ok"] is True and obj["backend"] == "jaccl" and len(obj["links"]) == 6
    assert obj["problems"] == []


def test_example_needing_fixes_exits_1_with_the_fixes() -> None:
    done = run("topology", "check", "--snapshot", SNAPSHOTS / "mesh-4x-needs-fixes", "--json")
    assert done.returncode == 1
    obj = json.loads(done.stdout)
    errors = {(p["code"], tuple(p["hosts"])) for p in obj["problems"] if p["severity"] == "error"}
    assert errors == {
        ("rdma_disabled", ("studio-c",)),
        ("tb_bridge_active", ("studio-a",)),
        ("missing_link", ("studio-b", "studio-d")),
        # the bridged ports hold no address of their own
        ("link_no_address", ("studio-a", "studio-b")),
        ("link_no_address", ("studio-a", "studio-c")),
    }
    assert obj["backend"] == "ring"
    ring = run(
        "topology", "check", "--snapshot", SNAPSHOTS / "mesh-4x-needs-fixes", "--backend", "ring"
    )
    assert ring.returncode == 0 and "WARNING rdma_disabled" in ring.stdout


def test_example_eight_hosts_ring_only(tmp_path: Path) -> None:
    snap = SNAPSHOTS / "mesh-8x-m3-ultra"
    assert run("topology", "check", "--snapshot", snap).returncode == 1
    done = run(
        "topology",
        "check",
        "--snapshot",
        snap,
        "--backend",
        "jaccl-ring",
        "--dot",
        tmp_path / "w.dot",
    )
    assert done.returncode == 0, done.stdout
    dot = (tmp_path / "w.dot").read_text()
    assert dot.count(" -- ") == 20 + 8  # 20 cables, 8 missing pairs drawn red


def test_examples_match_the_generator(tmp_path: Path) -> None:
    # hostfiles/snapshots is committed; it must be what scripts/make_example_snapshots.py writes.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mk", ROOT / "scripts" / "make_example_snapshots.py"
    )
    assert spec and spec.loader
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    for name, build in [
        ("mesh-4x-m3-ultra", mk.mesh_4x),
        ("mesh-8x-m3-ultra", mk.mesh_8x),
        ("mesh-4x-needs-fixes", mk.needs_fixes),
    ]:
        build().write(tmp_path / name)
        for f in (tmp_path / name).rglob("*"):
            if f.is_file():
                assert f.read_bytes() == (SNAPSHOTS / f.relative_to(tmp_path)).read_bytes(), f


def test_snapshot_localhost_on_linux_then_check(tmp_path: Path) -> None:
    out = tmp_path / "snap"
    done = run("topology", "snapshot", "--hosts", "localhost", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "localhost: not a Mac (Linux)" in done.stdout
    assert (out / "localhost" / "sw_vers.txt.error").is_file()
    assert (out / "localhost" / "uname.txt").read_text() == "Linux\n"
    check = run("topology", "check", "--snapshot", out, "--json")
    assert check.returncode == 1
    obj = json.loads(check.stdout)
    assert obj["backend"] == "ring"
    assert [p["code"] for p in obj["problems"]] == ["not_a_mac"]
    # rates.json: measured by this python's microbenchmark, recorded as printed, shown by check
    measured = parse_rates((out / "localhost" / "rates.json").read_text())
    assert measured.device == "cpu" and measured.copy_gbs > 0
    assert obj["hosts"][0]["rates"] == measured.to_json()
    text = run("topology", "check", "--snapshot", out, "--backend", "ring")
    assert (
        text.returncode == 0 and "not a Mac" in text.stdout and "WARNING not_a_mac" in text.stdout
    )
    again = run("topology", "snapshot", "--hosts", "localhost", "--out", out)
    assert "already exists and is not empty" in one_line_error(again)


def test_check_cluster_file_probes_live(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("hosts: [{name: here, ssh: localhost}]\nbackend: ring\n")
    done = run("topology", "check", tmp_path / "c.yaml", "--json")
    assert done.returncode == 0, (
        done.stdout + done.stderr
    )  # the file's backend (ring) is the target
    assert json.loads(done.stdout)["hosts"][0]["name"] == "here"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ([], "give exactly one of"),
        (["--hosts", "a", "--snapshot", "x"], "give exactly one of"),
        (["--snapshot", "/no/such/dir"], "no such directory"),
        (["--snapshot", "hostfiles"], "not a snapshot"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra/studio-a"], "give its parent"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--backend", "mpi"], "--backend"),
        (
            ["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--dot", "/no/such/d.dot"],
            "--dot",
        ),
        (["/no/such/cluster.yaml"], "no such cluster file"),
        (["--hosts", "a,,b"], "--hosts"),
    ],
)
def test_check_bad_input_is_one_line_exit_2(args: list[str], match: str) -> None:
    assert match in one_line_error(run("topology", "check", *args))


CLUSTER_PROBLEMS = {
    "unknown_key": ("hosts: [{name: a, ssh: a}]\nbakend: ring\n", "unknown key"),
    "unknown_host_key": ("hosts: [{name: a, ssh: a, port: 22}]\n", "unknown key"),
    "wrong_type": ("hosts: [{name: a, ssh: a, ips: 10.0.0.1}]\n", "must be a list"),
    "empty_hosts": ("hosts: []\n", "non-empty list"),
    "duplicate_names": ("hosts: [{name: a, ssh: a}, {name: a, ssh: b}]\n", "duplicate host name"),
    "shell_host": ("hosts: ['a;touch MARKER']\n", "not a valid ssh destination"),
    "shell_subst": ("hosts: [{name: a, ssh: '$(touch MARKER)'}]\n", "not a valid ssh destination"),
    "shell_backtick": (
        "hosts: [{name: a, ssh: '`touch MARKER`'}]\n",
        "not a valid ssh destination",
    ),
    "shell_python": ("hosts: [{name: a, ssh: a, python: 'py;touch MARKER'}]\n", "not a valid path"),
    "not_yaml": ("hosts: [a\n", "not valid YAML"),
}


@pytest.mark.parametrize("kind", sorted(CLUSTER_PROBLEMS))
@pytest.mark.parametrize("command", ["check", "snapshot"])
def test_bad_cluster_file_refused_before_anything_runs(
    tmp_path: Path, kind: str, command: str
) -> None:
    text, match = CLUSTER_PROBLEMS[kind]
    marker = tmp_path / "marker"
    (tmp_path / "c.yaml").write_text(text.replace("MARKER", str(marker)))
    extra = ["--out", str(tmp_path / "out")] if command == "snapshot" else []
    done = run("topology", command, tmp_path / "c.yaml", *extra, cwd=tmp_path)
    assert match in one_line_error(done)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_hosts_flag_with_shell_characters_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for bad in (f"a;touch {marker}", f"$(touch {marker})", f"`touch {marker}`"):
        done = run("topology", "snapshot", "--hosts", bad, "--out", tmp_path / "o")
        assert "not a valid" in one_line_error(done)
    assert not marker.exists()


def test_snapshot_needs_out_and_a_source(tmp_path: Path) -> None:
    one_line_error(run("topology", "snapshot", "--hosts", "localhost"))
    assert "exactly one of" in one_line_error(run("topology", "snapshot", "--out", tmp_path / "o"))


def test_unparsable_snapshot_files_are_problems_not_crashes(tmp_path: Path) -> None:
    c = synth.mesh(2)
    c.host("studio-b").garbage = frozenset(
        {"system_profiler_SPThunderboltDataType.json", "sysctl.txt"}
    )
    c.write(tmp_path)
    done = run("topology", "check", "--snapshot", tmp_path, "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    codes = [p["code"] for p in json.loads(done.stdout)["problems"]]
    assert codes.count("probe_missing") == 2


def test_model_problems_come_from_the_planner(tmp_path: Path) -> None:
    models = ROOT / "tests" / "fixtures" / "models"
    synth.mesh(2, preset="m4-pro-mini").write(tmp_path / "minis")  # 2 x 64 GB
    done = run(
        "topology",
        "check",
        "--snapshot",
        tmp_path / "minis",
        "--model",
        models / "deepseek-v3-4bit",
        "--json",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    problems = json.loads(done.stdout)["problems"]
    assert "model_does_not_fit" in {p["code"] for p in problems if p["severity"] == "error"}
    snap8, qwen = SNAPSHOTS / "mesh-8x-m3-ultra", models / "qwen3-235b-a22b-4bit"
    eight = run(
        "topology",
        "check",
        "--snapshot",
        snap8,
        "--backend",
        "jaccl-ring",
        "--model",
        qwen,
        "--json",
    )
    assert eight.returncode == 0, eight.stdout + eight.stderr
    # 4 KV heads over 8 ranks: replicated, tensor splits now, so no tensor problem at all
    codes = {p["code"] for p in json.loads(eight.stdout)["problems"]}
    assert not any(code.startswith("tp_") for code in codes), codes
    # 4 query heads cannot split 8 ways, but pipeline fits: a warning naming the limit
    config = json.loads((qwen / "config.json").read_text())
    (tmp_path / "four-heads").mkdir()
    (tmp_path / "four-heads" / "config.json").write_text(
        json.dumps({**config, "num_attention_heads": 4, "num_key_value_heads": 4})
    )
    few = run(
        "topology",
        "check",
        "--snapshot",
        snap8,
        "--backend",
        "jaccl-ring",
        "--model",
        tmp_path / "four-heads",
        "--json",
    )
    assert few.returncode == 0, few.stdout + few.stderr
    [tp] = [p for p in json.loads(few.stdout)["problems"] if p["code"] == "tp_cannot_split"]
    assert tp["severity"] == "warning"
    assert tp["message"] == (
        "tensor parallel over 8 ranks needs at least 8 attention heads (the model has 4)"
    )
    assert "at most 4 hosts" in tp["fix"]
    bad = run(
        "topology",
        "check",
        "--snapshot",
        SNAPSHOTS / "mesh-4x-m3-ultra",
        "--model",
        tmp_path / "none",
    )
    assert "--model" in one_line_error(bad)


def test_setup_on_the_ready_example_has_nothing_to_do() -> None:
    done = run("topology", "setup", "--snapshot", SNAPSHOTS / "mesh-4x-m3-ultra", "--json")
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    assert set(obj) == {"hosts", "links", "manual"} and obj["manual"] == []
    assert [h["commands"] for h in obj["hosts"]] == [[], [], [], []]
    assert len(obj["links"]) == 6 and all(k["prefix_len"] == 30 for k in obj["links"])
    text = run("topology", "setup", "--snapshot", SNAPSHOTS / "mesh-4x-m3-ultra")
    assert text.returncode == 0 and "Nothing to do" in text.stdout


def test_setup_then_check_on_a_freshly_cabled_snapshot(tmp_path: Path) -> None:
    from snapshot_edit import apply_setup_to_dir

    c = synth.mesh(4)
    for cable in c.cables:
        cable.a_ip = cable.b_ip = None
    c.host("studio-b").bridge = (1,)
    snap = c.write(tmp_path / "snap")
    before = run("topology", "check", "--snapshot", snap, "--json")
    assert before.returncode == 1
    done = run("topology", "setup", "--snapshot", snap, "--json")
    assert done.returncode == 1, done.stderr  # commands to run: not ready yet
    obj = json.loads(done.stdout)
    assert obj["manual"] == [] and sum(len(h["commands"]) for h in obj["hosts"]) == 1 + 12
    apply_setup_to_dir(snap, obj)
    after = run("topology", "check", "--snapshot", snap, "--json")
    assert after.returncode == 0, after.stdout
    again = run("topology", "setup", "--snapshot", snap, "--json")
    assert again.returncode == 0 and all(
        h["commands"] == [] for h in json.loads(again.stdout)["hosts"]
    )


def test_setup_lists_what_only_a_person_can_do() -> None:
    done = run("topology", "setup", "--snapshot", SNAPSHOTS / "mesh-4x-needs-fixes")
    assert done.returncode == 1
    assert "sudo ifconfig bridge0 deletem" in done.stdout
    assert "sudo networksetup -setmanual 'Thunderbolt" in done.stdout
    assert "studio-c: Boot studio-c into Recovery" in done.stdout


def test_setup_and_apply_on_this_linux_box_touch_nothing(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("hosts: [{name: here, ssh: localhost}]\nbackend: ring\n")
    done = run("topology", "setup", tmp_path / "c.yaml", "--apply")
    assert done.returncode == 0, done.stdout + done.stderr  # the TCP ring needs no command
    assert "here: not a Mac; setup leaves it alone" in done.stdout
    assert "Verdict: ready for ring" in done.stdout


def test_fast_synch_in_a_cluster_file_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "hosts: [{name: here, ssh: localhost}]\nbackend: ring\nenv: [MLX_METAL_FAST_SYNCH=1]\n"
    )
    done = run("topology", "check", tmp_path / "c.yaml", "--json")
    assert done.returncode == 0, done.stderr
    [p] = [p for p in json.loads(done.stdout)["problems"] if p["code"] == "fast_synch_unsafe"]
    assert p["severity"] == "warning" and "mlx #3142" in p["message"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ([], "give exactly one of"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--apply"], "--apply"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--backend", "mpi"], "--backend"),
        (["--snapshot", "/no/such/dir"], "no such directory"),
        (["--snapshot", "hostfiles"], "not a snapshot"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--discover"], "--discover"),
        (["/no/such/cluster.yaml"], "no such cluster file"),
        (["--hosts", "a,,b", "--apply"], "--hosts"),
        (["--hosts", "$(touch /tmp/setup-marker)"], "not a valid"),
        (["--snapshot", "hostfiles/snapshots/mesh-4x-m3-ultra", "--json", "extra"], "exactly one"),
    ],
)
def test_setup_bad_input_is_one_line_exit_2(args: list[str], match: str) -> None:
    assert match in one_line_error(run("topology", "setup", *args))
    assert not Path("/tmp/setup-marker").exists()


@pytest.mark.parametrize("kind", sorted(CLUSTER_PROBLEMS))
def test_setup_refuses_a_bad_cluster_file_before_anything_runs(tmp_path: Path, kind: str) -> None:
    text, match = CLUSTER_PROBLEMS[kind]
    marker = tmp_path / "marker"
    (tmp_path / "c.yaml").write_text(text.replace("MARKER", str(marker)))
    done = run("topology", "setup", tmp_path / "c.yaml", "--apply", cwd=tmp_path)
    assert match in one_line_error(done)
    assert not marker.exists()


def test_setup_with_an_unreadable_snapshot_host_yaml_is_one_line(tmp_path: Path) -> None:
    synth.mesh(2).write(tmp_path)
    (tmp_path / "studio-a" / "host.yaml").write_text("ssh: &a x\nips: *a\n")
    assert "anchors" in one_line_error(run("topology", "setup", "--snapshot", tmp_path))
