"""Hostfiles read by mlx's own parser and accepted (or refused) by the real `mlx.launch`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import synth
from mlx._distributed_utils.common import Hostfile
from paths import FIXTURES, MLX_CLUSTER, MLX_LAUNCH

from topology.facts import CheckResult
from topology.model.spec import ModelSpec, spec_from_config
from topology.planning.hostfile import hostfile_json
from topology.planning.plan import Plan, plan_cluster, plan_local
from topology.problems import check

# Each rank prints what mlx.launch handed it: rank, backend files and coordinator. One write of
# the whole line: mlx.launch interleaves its ranks' reads, and print() under PYTHONUNBUFFERED
# writes the text and its newline apart, so two ranks' lines could run together.
PRINT_ENV = (
    "import json, os\n"
    "def read(name):\n"
    "    path = os.environ.get(name)\n"
    "    return json.load(open(path)) if path and os.path.getsize(path) > 1 else None\n"
    "os.write(1, (json.dumps({'rank': int(os.environ['MLX_RANK']),"
    " 'coordinator': os.environ.get('MLX_JACCL_COORDINATOR'),"
    " 'ring': os.environ.get('MLX_JACCL_RING'),"
    " 'devices': read('MLX_IBV_DEVICES'), 'hostfile': read('MLX_HOSTFILE')}) + '\\n').encode())\n"
)


def spec() -> ModelSpec:
    raw = json.loads((FIXTURES / "models" / "qwen3-32b-8bit" / "config.json").read_text())
    return spec_from_config(raw, source="qwen3-32b-8bit")


def planned(c: synth.Cluster, backend: str = "auto") -> tuple[CheckResult, Plan, dict[str, Any]]:
    result = check(c.facts(), backend)
    plan = plan_cluster(result, spec(), backend=backend)
    assert plan.ok, plan.problems
    return result, plan, hostfile_json(plan, result.links, ["MLX_METAL_FAST_SYNCH=0"])


def write(tmp_path: Path, hostfile: dict[str, Any]) -> Path:
    path = tmp_path / "hostfile.json"
    path.write_text(json.dumps(hostfile))
    return path


def run_mlx_launch(tmp_path: Path, hostfile: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The real mlx.launch with every host pointed at this machine (127.0.0.1 runs locally)."""
    local = {**hostfile, "hosts": [{**h, "ssh": "127.0.0.1"} for h in hostfile["hosts"]]}
    path = write(tmp_path, local)
    return subprocess.run(
        [str(MLX_LAUNCH), "--hostfile", str(path), "--", sys.executable, "-c", PRINT_ENV],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip


def rank_reports(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return sorted(reports, key=lambda r: r["rank"])


def test_jaccl_mesh_hostfile_parsed_by_mlx_and_launched(tmp_path: Path) -> None:
    c = synth.mesh(4)
    result, plan, hostfile = planned(c)
    parsed = Hostfile.from_file(write(tmp_path, hostfile))
    assert parsed.backend == "jaccl" and parsed.envs == ["MLX_METAL_FAST_SYNCH=0"]
    assert [h.ssh_hostname for h in parsed.hosts] == [r.ssh for r in plan.ranks]
    assert [h.ips for h in parsed.hosts] == [[f"192.168.1.{10 + i}"] for i in range(4)]
    for i, host in enumerate(parsed.hosts):
        for j, device in enumerate(host.rdma):
            if i == j:
                assert device is None
                continue
            a, b = plan.ranks[i].host, plan.ranks[j].host
            link = next(k for k in result.links if {k.a, k.b} == {a, b})
            assert device == f"rdma_{c.iface(a, link.port_of(a))}"  # this end of that cable
    out = run_mlx_launch(tmp_path, hostfile)
    reports = rank_reports(out)
    assert [r["rank"] for r in reports] == [0, 1, 2, 3], out.stderr
    for r in reports:
        assert r["coordinator"] == "192.168.1.10:32323"  # rank 0's first ip
        assert r["devices"] == [h["rdma"] for h in hostfile["hosts"]]


def test_mlx_launch_refuses_a_matrix_with_a_hole(tmp_path: Path) -> None:
    """Proves the launch above really went through mlx.launch's jaccl checks."""
    _, _, hostfile = planned(synth.mesh(3))
    hostfile["hosts"][1]["rdma"][2] = None
    out = run_mlx_launch(tmp_path, hostfile)
    assert out.returncode == 2 and "no RDMA device is listed" in out.stderr
    assert rank_reports(out) == []


def test_jaccl_ring_lists_only_ring_neighbours(tmp_path: Path) -> None:
    _, plan, hostfile = planned(synth.ring(5))
    assert plan.backend == "jaccl-ring"
    for i, h in enumerate(hostfile["hosts"]):
        neighbours = {(i - 1) % 5, (i + 1) % 5}
        assert [j for j, d in enumerate(h["rdma"]) if d is not None] == sorted(neighbours)
    reports = rank_reports(run_mlx_launch(tmp_path, hostfile))
    assert len(reports) == 5 and all(r["ring"] == "1" for r in reports)


def test_ring_hostfile_uses_each_ranks_address_towards_its_left_neighbour(tmp_path: Path) -> None:
    *_, hostfile = planned(synth.ring(3, rdma=False), "ring")
    parsed = Hostfile.from_file(write(tmp_path, hostfile))
    assert parsed.backend == "ring" and all(h.rdma == [] for h in parsed.hosts)
    # synth numbers cable k 10.0.k.1 (its first end) / 10.0.k.2: a-b is 0, b-c 1, c-a 2.
    assert [h.ips for h in parsed.hosts] == [["10.0.2.2"], ["10.0.0.2"], ["10.0.1.2"]]
    reports = rank_reports(run_mlx_launch(tmp_path, hostfile))
    assert [r["hostfile"] for r in reports] == [
        [["10.0.2.2:32323"], ["10.0.0.2:32324"], ["10.0.1.2:32325"]]
    ] * 3


def test_two_cables_between_a_pair_are_listed_in_the_same_order_on_both_ends() -> None:
    c = synth.mesh(2)
    c.cable("studio-a", "studio-b")
    result, _, hostfile = planned(c)
    row_a, row_b = (h["rdma"] for h in hostfile["hosts"])
    assert isinstance(row_a[1], list) and len(row_a[1]) == 2
    for dev_a, dev_b in zip(row_a[1], row_b[0], strict=True):  # the k-th of each: one cable
        cable = next(k for k in result.links if f"rdma_{k.iface_of('studio-a')}" == dev_a)
        assert dev_b == f"rdma_{cable.iface_of('studio-b')}"


def test_local_plan_hostfile_runs_on_this_machine(tmp_path: Path) -> None:
    from topology.chips import GIB
    from topology.facts import HostFacts

    plan = plan_local(HostFacts(name="localhost", memory_bytes=64 * GIB), 3, spec())
    hostfile = hostfile_json(plan)
    assert hostfile == {
        "backend": "ring",
        "envs": [],
        "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": []}] * 3,
    }
    reports = rank_reports(run_mlx_launch(tmp_path, hostfile))
    assert [len(r["hostfile"]) for r in reports] == [3, 3, 3]


def test_no_hostfile_without_a_plan() -> None:
    result = check(synth.cluster(1, memory_gb=16).facts())
    plan = plan_cluster(result, spec())
    assert not plan.ok
    with pytest.raises(ValueError):
        hostfile_json(plan, result.links)


def test_double_cables_written_by_plan_out_pair_up_and_mlx_reads_them(tmp_path: Path) -> None:
    """Two cables per pair (a-b, b-c), set up and planned through the CLI: jaccl pairs the k-th
    device of each side, so row i's k-th device and row j's k-th device are one cable."""
    c = synth.mesh(3)
    c.cable("studio-a", "studio-b", a_ip=None, b_ip=None)  # the second a-b cable: not set up yet
    c.cable("studio-c", "studio-b")  # listed from c's side first: order must not depend on it
    snap = c.write(tmp_path / "snap")
    cli = MLX_CLUSTER
    setup = subprocess.run(
        [str(cli), "topology", "setup", "--snapshot", str(snap), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert setup.returncode == 1, setup.stderr  # one cable lacks addresses: one command per end
    from snapshot_edit import apply_setup_to_dir

    apply_setup_to_dir(snap, json.loads(setup.stdout))
    model = FIXTURES / "models" / "qwen3-32b-8bit"
    out = tmp_path / "plan"
    done = subprocess.run(
        [str(cli), "plan", "--snapshot", str(snap), "--model", str(model), "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    hostfile = json.loads((out / "hostfile.json").read_text())
    parsed = Hostfile.from_file(out / "hostfile.json")
    assert parsed.backend == "jaccl" and [h.ssh_hostname for h in parsed.hosts] == synth.names(3)
    links = check(c.facts()).links
    rows = [h.rdma for h in parsed.hosts]
    names = synth.names(3)
    for i, j in ((0, 1), (1, 2)):
        mine, theirs = rows[i][j], rows[j][i]
        assert isinstance(mine, list) and isinstance(theirs, list) and len(mine) == 2
        for dev_i, dev_j in zip(mine, theirs, strict=True):
            cable = next(
                k for k in links
                if names[i] in (k.a, k.b) and f"rdma_{k.iface_of(names[i])}" == dev_i
            )  # fmt: skip
            assert {cable.a, cable.b} == {names[i], names[j]}
            assert dev_j == f"rdma_{cable.iface_of(names[j])}"  # the other end of that cable
    assert isinstance(rows[0][2], str)  # one cable a-c: a single device
    reports = rank_reports(run_mlx_launch(tmp_path, hostfile))
    assert [r["devices"] for r in reports] == [rows] * 3
