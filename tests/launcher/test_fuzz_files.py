"""Every reader of untrusted input fed generated hostile inputs: a result or one line, nothing else.

Inputs are deterministic (seeded): deep nesting (100 KB of '['), YAML alias bombs, huge and
non-finite numbers, wrong types, control characters and trailing newlines in values, non-UTF-8
bytes, truncations and byte flips of valid files. Each target runs in its own child process under
a 1 GiB address-space limit (RLIMIT_AS), so an expansion blow-up is a MemoryError there, not an
exhausted machine, and a segfault is a failed exit code, not a dead test run. The child reports
each case's outcome and time; the test asserts no other exception, one short line, bounded time.
A handful then run end to end through the real CLI, under the same memory limit.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from paths import MLX_CLUSTER

TESTS = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 1 << 30
CASE_SECONDS = 3.0  # per case, on a slow shared machine; real parses take milliseconds
MAX_MESSAGE = 300

HUGE = ["9" * 5000, "1e999", "-1e999", "NaN", "Infinity", "1e308", "-1", "0", "true", "1.5",
        "18446744073709551616", '"12"', "null", "[]", "{}", ".nan", ".inf"]  # fmt: skip
STRINGS = ["a\n", "a\x1b[31m", "$(touch x)", "-oProxyCommand=x", "x" * 100_000, "a\x00b",
           "\u2028", "\udcff", "../../etc/passwd", "a b"]  # fmt: skip
LAUGHS = "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def blobs(rng: random.Random) -> dict[str, bytes]:
    """Hostile inputs for any parser, whatever format it expects."""
    deep_yaml = "".join(" " * i + "a:\n" for i in range(1000))
    fixed = {
        "json_brackets_100k": b"[" * 100_000,
        "json_objects_deep": b'{"a":' * 30_000,
        "yaml_dashes_deep": b"- " * 50_000 + b"x",
        "yaml_indent_deep": deep_yaml.encode(),
        "billion_laughs": ("a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + LAUGHS).encode(),
        # the bomb as a value that an error message would quote: megabytes once expanded
        "laughs_in_value": (
            "a: &a [x,x,x,x,x,x,x,x,x]\n" + LAUGHS + "hosts: [{name: *i}]\n"
        ).encode(),
        "merge_key": b"a: &a {x: 1}\nb: {<<: *a}\n",
        "huge_int": b"9" * 5000,
        "huge_int_key": b'{"num_hidden_layers": ' + b"9" * 5000 + b"}",
        "float_overflow": b'{"hidden_size": 1e999, "wired_limit_gb": 1e999}',
        "nan": b'{"vocab_size": NaN}',
        "non_utf8": b"hosts: [\xff\xfe]\n",
        "overlong_utf8": b"\xc0\xaf\xe0\x80\xaf",
        "nul_bytes": b"\x00" * 100,
        "bom": "\ufeff{}".encode(),
        "empty": b"",
        "whitespace": b"  \n\t ",
        "null": b"null",
        "empty_list": b"[]",
        "bare_string": b'"x"',
        "big_flat_yaml": b"- a\n" * 100_000,
        "big_flat_json": b"[" + b"0," * 150_000 + b"0]",
        "long_line": b"a" * 1_000_000,
        "python_tag": b"!!python/object/apply:os.system ['touch x']\n",
        "binary_tag": b"a: !!binary AAAA\n",
        "bad_timestamp": b"a: !!timestamp 2001-13-45\n",
        "complex_key": b"? [a, b]\n: c\n",
        "sexagesimal": b"a: 1:20:30\n",
        "json_lone_surrogate": b'{"model_type": "\\udcff", "a": "\\ud800"}',
        "control_values": b'hosts: [{name: "a\\n", ssh: "a\\u001b"}]\n',
    }
    return fixed | {f"random_{i}": rng.randbytes(rng.randint(1, 2048)) for i in range(4)}


def raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def mutations(rng: random.Random, valid: bytes, n: int = 40) -> dict[str, bytes]:
    """Truncations, byte flips, inserted control characters, swapped numbers and strings."""
    out: dict[str, bytes] = {"valid": valid}
    text = valid.decode("utf-8", "surrogateescape")
    numbers = [m.span() for m in re.finditer(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", text)]
    words = [m.span() for m in re.finditer(r"[A-Za-z][A-Za-z0-9_.-]+", text)]
    for i in range(n):
        kind = i % 5
        at = rng.randrange(max(1, len(valid)))
        if kind == 0:
            out[f"truncated_{at}"] = valid[:at]
        elif kind == 1:
            out[f"flip_{at}"] = valid[:at] + bytes([rng.randrange(256)]) + valid[at + 1 :]
        elif kind == 2:
            ch = rng.choice(["\n", "\x00", "\x1b", "\x85", "\u2028", "\t"]).encode()
            out[f"control_{at}"] = valid[:at] + ch + valid[at:]
        else:
            spans, swaps = (numbers, HUGE) if kind == 3 else (words, STRINGS)
            if spans:
                a, b = rng.choice(spans)
                new = rng.choice(swaps).encode("utf-8", "surrogatepass")
                out[f"swap_{kind}_{i}"] = raw(text[:a]) + new + raw(text[b:])
    return out


# ---- the child: one target's cases under the memory limit -------------------------------------


def _child(target: str, work: Path, seed: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    root = Path(__file__).resolve().parents[2]
    # tests/ for synth (this folder, for fuzz_targets, is already there); the repo too, or
    # tests/cluster (no __init__.py) is taken for the package and hides cluster.files.
    sys.path[:0] = [str(root / "tests"), str(root)]
    import fuzz_targets

    from topology.errors import InputError

    # target -> (valid samples to mutate, run one payload, the exceptions it may raise)
    samples, run, allowed = fuzz_targets.targets(root)[target]

    rng = random.Random(f"{target}-{seed}")
    cases = blobs(rng)
    for i, valid in enumerate(samples):
        cases |= {f"s{i}_{k}": v for k, v in mutations(rng, valid).items()}
    results = []
    for name, payload in cases.items():
        case_dir = work / f"c{len(results)}"
        case_dir.mkdir()
        started = time.monotonic()
        outcome, message = "ok", ""
        try:
            run(payload, case_dir)
        except InputError as e:
            outcome, message = "input_error", str(e).replace(str(work), "<dir>")
        except allowed as e:
            outcome, message = "expected", str(e).replace(str(work), "<dir>")
        except BaseException as e:  # the point: anything else is reported, not raised
            outcome = "crash"
            message = f"{type(e).__name__}: {traceback.format_exc()[-1500:]}"
        seconds = time.monotonic() - started
        results.append({"case": name, "outcome": outcome, "message": message, "seconds": seconds})
    print(json.dumps({"cases": results, "peak_rss_kb": _peak_kb()}))


def _peak_kb() -> int:
    """This process's own peak RSS. Linux keeps ru_maxrss across fork and exec, so it would
    report the pytest worker's peak (1.07 GB was seen); VmHWM belongs to this process's memory."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS counts bytes


# ---- the tests -------------------------------------------------------------------------------

TARGETS = ["cluster", "host_yaml", "probe_files", "config", "index", "calibration",
           "plan_json", "hostfile_json", "rank_index", "agent_answer", "agent_txt"]  # fmt: skip


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_inputs_give_a_result_or_one_line(target: str, tmp_path: Path) -> None:
    started = time.monotonic()
    # The child runs this file as a script: tests/ (for paths.py) goes on its path too.
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, __file__, target, str(tmp_path), "14"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    cases: list[dict[str, Any]] = report["cases"]
    assert len(cases) >= 50
    crashes = [c for c in cases if c["outcome"] == "crash"]
    assert not crashes, crashes[:3]
    slow = [(c["case"], round(c["seconds"], 2)) for c in cases if c["seconds"] > CASE_SECONDS]
    assert not slow, slow
    for c in cases:
        assert "\n" not in c["message"] and len(c["message"]) < MAX_MESSAGE, c
        assert "Traceback" not in c["message"], c
    assert report["peak_rss_kb"] * 1024 < MEMORY_LIMIT
    outcome = {c["case"]: c["outcome"] for c in cases}
    # the harness reaches the real reader: good input passes, the worst is refused
    assert all(o == "ok" for name, o in outcome.items() if name.endswith("_valid")), outcome
    if target != "probe_files":  # probe outputs never raise: they become probe gaps
        for name in ("json_brackets_100k", "billion_laughs", "huge_int_key", "non_utf8"):
            assert outcome[name] != "ok", name
    assert time.monotonic() - started < 60


# ---- end to end through the real CLI ------------------------------------------------------------

CLI = str(MLX_CLUSTER)


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        [CLI, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd,
        stdin=subprocess.DEVNULL, preexec_fn=_limited,
    )  # fmt: skip
    assert time.monotonic() - started < 30, args
    assert "Traceback" not in done.stdout + done.stderr
    return done


def one_line(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlx-cluster: error: "), done.stderr[-2000:]
    assert words in lines[0] and len(lines[0]) < 400, lines[0]


BAD_CLUSTERS = {
    "laughs": (("hosts: [a]\n" + "a: &a [x,x,x,x,x,x,x,x,x]\n" + LAUGHS), "anchors and aliases"),
    "deep": ("hosts: " + "[" * 100_000, "nested more than 32 levels"),
    "huge": ("hosts: [{name: a, ssh: a, wired_limit_gb: " + "9" * 5000 + "}]", "not valid YAML"),
    "absurd": ("hosts: [{name: a, ssh: a, bandwidth_gbs: 1.0e+300}]", "from 1.0 to 100,000.0"),
    "newline": ('hosts: [{name: a, ssh: "a\\n"}]', "not a valid ssh destination"),
    "proxy": ("hosts: [a]\nssh_options: ['-o', 'ProxyCommand=touch MARKER']", "~/.ssh/config"),
}


@pytest.mark.parametrize("kind", sorted(BAD_CLUSTERS))
def test_bad_cluster_file_is_one_line_exit_2(kind: str, tmp_path: Path) -> None:
    text, words = BAD_CLUSTERS[kind]
    (tmp_path / "bad.yaml").write_text(text.replace("MARKER", str(tmp_path / "marker")))
    one_line(cli("topology", "check", "bad.yaml", cwd=tmp_path), words)
    assert not (tmp_path / "marker").exists()


def test_bad_model_config_and_context_are_one_line_exit_2(tmp_path: Path) -> None:
    import fuzz_targets

    model = tmp_path / "m"
    model.mkdir()
    for config, words in [
        ("[" * 100_000, "config.json: nested more than 32 levels deep"),
        ('{"model_type": "llama", "num_hidden_layers": ' + "9" * 5000 + "}", "thousands of digits"),
        (json.dumps({**fuzz_targets.LLAMA, "num_hidden_layers": 10**12}), "from 1 to 1,024"),
        (json.dumps({**fuzz_targets.LLAMA, "hidden_size": 1e308}), "hidden_size: must be"),
    ]:
        (model / "config.json").write_text(config)
        one_line(cli("plan", "--local", "1", "--model", model, cwd=tmp_path), words)
    (model / "config.json").write_text(json.dumps(fuzz_targets.LLAMA))
    beyond = cli("plan", "--local", "1", "--model", model, "--context", "100000", cwd=tmp_path)
    one_line(beyond, "max_position_embeddings (2,048")
    ok = cli("plan", "--local", "1", "--model", model, "--json", cwd=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["context"] == 2048, ok.stderr


def test_host_yaml_that_is_not_utf8_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "snap" / "h").mkdir(parents=True)
    (tmp_path / "snap" / "h" / "sysctl.txt").write_text("hw.memsize: 68719476736\n")
    (tmp_path / "snap" / "h" / "host.yaml").write_bytes(b"ssh: h\xff.local\n")
    done = cli("topology", "check", "--snapshot", "snap", cwd=tmp_path)
    one_line(done, "host.yaml: not UTF-8 text (byte 0xff at offset 6)")


def test_a_snapshot_holding_only_sysctl_fails_the_check(tmp_path: Path) -> None:
    (tmp_path / "snap" / "h").mkdir(parents=True)
    (tmp_path / "snap" / "h" / "sysctl.txt").write_text("hw.memsize: 68719476736\n")
    done = cli("topology", "check", "--snapshot", "snap", "--json", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr == ""
    obj = json.loads(done.stdout)
    assert obj["ok"] is False and obj["backend"] is None
    assert any("sw_vers.txt" in p["message"] for p in obj["problems"] if p["severity"] == "error")
    text = cli("topology", "check", "--snapshot", "snap", cwd=tmp_path)
    assert text.returncode == 1 and "nothing reliable is known about h" in text.stdout


def test_an_unreachable_single_host_fails_the_check(tmp_path: Path) -> None:
    # Real ssh to a closed port on this machine: refused at once.
    (tmp_path / "one.yaml").write_text(
        "hosts: [{name: gone, ssh: 127.0.0.1}]\n"
        "ssh_options: ['-p', '1', '-o', 'ConnectTimeout=3']\n"
    )
    done = cli("topology", "check", "one.yaml", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    obj = json.loads(done.stdout)
    assert obj["ok"] is False and obj["backend"] is None
    [p] = obj["problems"]
    assert p["code"] == "probe_missing" and "Connection refused" in p["message"]
    import fuzz_targets

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(fuzz_targets.LLAMA))
    plan = cli("plan", "one.yaml", "--model", tmp_path / "m", "--json", cwd=tmp_path)
    assert plan.returncode == 1 and json.loads(plan.stdout)["ranks"] == [], plan.stderr


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
