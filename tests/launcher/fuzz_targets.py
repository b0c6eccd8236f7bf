"""The readers test_fuzz_files.py feeds: for each, valid samples to mutate and how to run one
payload the way the product reads it (from a file on disk where it reads a file)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Run = Callable[[bytes, Path], None]
Target = tuple[list[bytes], Run, tuple[type[BaseException], ...]]

LLAMA = {
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000,
    "max_position_embeddings": 2048, "tie_word_embeddings": False,
}  # fmt: skip
INDEX = {
    "metadata": {"total_size": 1234567},
    "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.down_proj.weight": "model-00001-of-00002.safetensors",
        "model.layers.3.mlp.down_proj.weight": "model-00002-of-00002.safetensors",
    },
}
TXT = (
    b"proto=1\nname=studio-a\nssh=admin@studio-a.local\nmem=68719476736\nchip=Apple M3 Ultra\n"
    b"macos=26.2\nrdma=enabled\nmac=1\ntb=ABCD-1,EF-2\nver=0.1.0"
)
CLUSTER = b"""hosts:
  - name: studio-a
    ssh: admin@studio-a.local
    ips: [10.0.0.11, 10.0.1.11]
    python: ~/mlx-cluster/bin/python
    wired_limit_gb: 480
    bandwidth_gbs: 819
  - studio-b.local
backend: jaccl-ring
strategy: pipeline
env: ["MLX_METAL_FAST_SYNCH=1"]
ssh_options: ["-o", "ConnectTimeout=5", "-p", "2222", "-J", "me@jump:22", "-i", "~/.ssh/id"]
"""


def _write(directory: Path, name: str, payload: bytes) -> Path:
    path = directory / name
    path.write_bytes(payload)
    return path


def _snapshot(work: Path) -> Path:
    """A one-host snapshot directory holding sysctl.txt, for host.yaml payloads."""
    host = work / "snap" / "studio-a"
    host.mkdir(parents=True)
    (host / "sysctl.txt").write_text("hw.memsize: 68719476736\n")
    return host


def _model(work: Path, config: bytes, index: bytes | None = None) -> Path:
    model = work / "model"
    model.mkdir()
    _write(model, "config.json", config)
    if index is not None:
        _write(model, "model.safetensors.index.json", index)
    return model


def _plan_and_use(model: Path) -> None:
    """Read the model as `plan` does, then do the planner's arithmetic on it."""
    from launcher.planning.model_source import load_model_spec
    from topology.facts import HostFacts
    from topology.planning.plan import plan_local

    spec = load_model_spec(str(model))
    host = HostFacts("here", memory_bytes=64 << 30, chip="Apple M4 Max")
    json.dumps(plan_local(host, 2, spec).to_json())


def _probe_files(payload: bytes, work: Path) -> None:
    """Every probe file of one host replaced in turn: gaps only, and a printable report."""
    import synth

    from topology.host_facts import host_facts
    from topology.model.spec import spec_from_config
    from topology.planning.plan import plan_cluster
    from topology.problems import check
    from topology.report import check_json, dot, text_report

    spec = spec_from_config(LLAMA)
    files = synth.mesh(2).files()
    text = payload.decode("utf-8", "surrogateescape")  # as the snapshot reader decodes
    for name in list(files["studio-a"]):
        hostile = {**files["studio-a"], name: text, f"{name}.error": text}
        facts = [host_facts("studio-a", hostile), host_facts("studio-b", files["studio-b"])]
        result = check(facts)
        plan = json.dumps(plan_cluster(result, spec).to_json())  # the planner's arithmetic too
        for out in (text_report(result), dot(result), json.dumps(check_json(result)), plan):
            out.encode("utf-8")  # printable: no lone surrogate reaches stdout
            assert "\x1b" not in out, "a terminal escape reached the report"


def _good_plan() -> tuple[bytes, bytes]:
    """plan.json and hostfile.json as `plan --local 2 --out` writes them."""
    from launcher.planning.cluster_plan import plan_for_local
    from topology.model.spec import spec_from_config

    plan, hostfile = plan_for_local(2, spec_from_config(LLAMA), strategy="auto", context=None)
    return json.dumps(plan.to_json()).encode(), json.dumps(hostfile).encode()


def _plan_dir(work: Path, plan: bytes, hostfile: bytes) -> None:
    from launcher.ranks.target import plan_dir_target

    d = work / "plan"
    d.mkdir()
    _write(d, "plan.json", plan)
    _write(d, "hostfile.json", hostfile)
    plan_dir_target(str(d), None)


@contextmanager
def _serving(payload: bytes) -> Iterator[int]:
    """A one-answer HTTP server on 127.0.0.1 giving `payload` as an agent's snapshot."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.server_close()
        thread.join(timeout=5)


def _agent_answer(payload: bytes, work: Path) -> None:
    from launcher.discovery.browse import FoundAgent, fetch_snapshot
    from launcher.discovery.txt import AgentFacts

    with _serving(payload) as port:
        agent = FoundAgent("a._mlx-cluster._tcp.local.", ("127.0.0.1",), port,
                           AgentFacts("a", "a.local", "1"))  # fmt: skip
        files = fetch_snapshot(agent, timeout_s=5)
    from topology.host_facts import host_facts

    host_facts("a", files)


def _agent_txt(payload: bytes, work: Path) -> None:
    """A TXT record: one `key=value` string a line, decoded as zeroconf hands them over."""
    from launcher.discovery.txt import decode_txt

    text = payload.decode("utf-8", "replace")
    props: dict[str, str | None] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        props[key] = value if sep else None
    decode_txt(props)


def targets(root: Path) -> dict[str, Target]:
    from launcher.discovery.txt import TxtError
    from launcher.hosts.snapshots import load_snapshot
    from launcher.planning.calibration_store import load_calibration
    from topology.planning.calibration import Calibration, LinkMeasurement

    llama = json.dumps(LLAMA).encode()
    index = json.dumps(INDEX).encode()
    plan, hostfile = _good_plan()

    def cluster_file(p: bytes, w: Path) -> None:
        from launcher.hosts.gather import read_cluster

        read_cluster(str(_write(w, "cluster.yaml", p)))

    def host_yaml(p: bytes, w: Path) -> None:
        _write(_snapshot(w), "host.yaml", p)
        load_snapshot(w / "snap")

    def calibration_file(p: bytes, w: Path) -> None:
        load_calibration(_write(w, "calibration.json", p))

    def rank_index(p: bytes, w: Path) -> None:
        from cluster.load import local_files

        local_files(_model(w, llama, p), range(0, 2))

    calibration = Calibration(
        (LinkMeasurement("ring", 2, 1024, 1e-4, 1 << 24, 5e-2),), (("studio-a", 800.0),)
    )
    models = sorted((root / "tests" / "fixtures" / "models").glob("*/config.json"))
    examples = sorted((root / "hostfiles").glob("*.yaml"))
    sw_vers = b"ProductName: macOS\nProductVersion: 26.2\nBuildVersion: 25C56\n"
    return {
        "cluster": ([CLUSTER, *(p.read_bytes() for p in examples)], cluster_file, ()),
        "host_yaml": (
            [b"ssh: admin@a.local\nips: [10.0.0.1]\nwired_limit_gb: 64\n"],
            host_yaml,
            (),
        ),
        "probe_files": ([sw_vers], _probe_files, ()),
        "config": (
            [llama, *(p.read_bytes() for p in models)],
            lambda p, w: _plan_and_use(_model(w, p)),
            (),
        ),
        "index": ([index], lambda p, w: _plan_and_use(_model(w, llama, p)), ()),
        "calibration": ([json.dumps(calibration.to_json()).encode()], calibration_file, ()),
        "plan_json": ([plan], lambda p, w: _plan_dir(w, p, hostfile), ()),
        "hostfile_json": ([hostfile], lambda p, w: _plan_dir(w, plan, p), ()),
        "rank_index": ([index], rank_index, ()),
        "agent_answer": (
            [json.dumps({"sw_vers.txt": "ProductVersion: 26.2\n"}).encode()],
            _agent_answer,
            (OSError,),
        ),
        "agent_txt": (
            [TXT],
            _agent_txt,
            (TxtError,),
        ),
    }
