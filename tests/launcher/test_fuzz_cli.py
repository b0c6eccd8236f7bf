"""Every CLI command fed hostile values: one line on stderr, exit 2, no traceback, bounded time.

Most cases run in-process through launcher.cli.main.main (the entry point that maps errors to
exit codes); a few run the real executable, for argv bytes that are not UTF-8. Each baseline
names a model or file that does not exist, so even a value that slipped through would stop
before any rank, server or probe started — and the assertion that the line names the flag
would catch it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from paths import MLX_CLUSTER as CLI_PATH

from launcher.cli.main import cli, main

MLX_CLUSTER = str(CLI_PATH)
CASE_TIMEOUT_S = 5.0  # one in-process case; click refuses in milliseconds
RUN_TIMEOUT_S = 30.0  # one real process (imports included)
NOWHERE = "/nonexistent/mlx-cluster-fuzz"

# Refused by every numeric option (every range starts at 0 or above and ends below 2^64).
NUMBERS = [
    str(10**30), "-1", "nan", "NaN", "inf", "-inf", "1e999", "", "\n", "1\n", " 1", "0x10",
    "1_0", "1,5", "\x00", "\x1b[31m", "\udcff", "9" * 5000, "1" + "0" * 4300,
]  # fmt: skip
# Refused by every text option (names, hosts, paths, models, keys).
TEXTS = [
    "",
    "\n",
    "a\n",
    "a\rb",
    "a\x00b",
    "\x1b[2J",
    "a\u2028b",
    "\udcff",
    "\udce9t\udce9",
    "a" * 100_000,
]
PROMPTS = ["", "a\x00b", "\x1b[2J", "\udcff"]  # a prompt may hold newlines and tabs

BASE: dict[str, list[str]] = {  # a command line that would fail fast if nothing else did
    "launch": ["launch", "--local", "1", "--model", NOWHERE, "--prompt", "hi"],
    "serve": ["serve", "--local", "1", "--model", NOWHERE, "--port", "0"],
    "bench": ["bench", "--local", "1", "--model", NOWHERE],
    "plan": ["plan", "--local", "1", "--model", NOWHERE],
    "check": ["topology", "check", "--snapshot", NOWHERE],
    "snapshot": ["topology", "snapshot", f"{NOWHERE}/c.yaml", "--out", f"{NOWHERE}/out"],
    "tiny-model": ["tiny-model", f"{NOWHERE}/m"],
    "import-gguf": ["import-gguf", f"{NOWHERE}/m.gguf", f"{NOWHERE}/m"],
    "agent": ["agent", "--snapshot", NOWHERE],
    "discover": ["discover", "--timeout", "0.5", "--write-cluster", f"{NOWHERE}/c.yaml"],
    "demo": ["demo", "--max-tokens", "1"],
}
NUMERIC = {
    "launch": [
        "--local", "--max-tokens", "--temp", "--top-p", "--seed", "--rank-timeout",
        "--load-timeout",
    ],
    "serve": [
        "--local", "--port", "--max-concurrency", "--max-queue", "--prefix-cache-gb",
        "--rank-timeout", "--load-timeout",
    ],
    "bench": ["--local", "-p", "-g", "--trials"],
    "plan": ["--local", "--context"],
    "check": ["--context"],
    "tiny-model": [
        "--layers", "--hidden", "--heads", "--kv-heads", "--intermediate", "--quantize-bits",
        "--group-size", "--seed",
    ],
    "agent": ["--port", "--ttl"],
    "discover": ["--timeout"],
    "demo": ["--max-tokens"],
}  # fmt: skip
TEXTUAL = {
    "launch": ["--plan", "--model"],
    "serve": ["--model", "--host", "--api-key"],
    "bench": ["--model", "--sizes", "--strategies", "--json", "--plot"],
    "plan": ["--snapshot", "--model", "--out"],
    "check": ["--hosts", "--snapshot", "--model", "--dot"],
    "snapshot": ["--hosts", "--out"],
    "agent": ["--interface", "--name", "--ssh", "--snapshot"],
    "discover": ["--write-cluster"],
}
POSITIONAL = {  # where the positional value goes, and how the error line names it
    "launch": (["launch"], ["--model", NOWHERE, "--prompt", "hi"], "CLUSTER.yaml"),
    "serve": (["serve"], ["--model", NOWHERE], "CLUSTER.yaml"),
    "bench": (["bench"], ["--model", NOWHERE], "CLUSTER.yaml"),
    "plan": (["plan"], ["--model", NOWHERE], "CLUSTER.yaml"),
    "check": (["topology", "check"], [], "CLUSTER.yaml"),
    "snapshot": (["topology", "snapshot"], ["--out", f"{NOWHERE}/out"], "CLUSTER.yaml"),
    "tiny-model": (["tiny-model"], [], "DIRECTORY"),
    "import-gguf": (["import-gguf"], [f"{NOWHERE}/m"], "FILE.gguf"),
    "import-gguf DIRECTORY": (["import-gguf", f"{NOWHERE}/m.gguf"], [], "DIRECTORY"),
}


def _flag_cases() -> Iterator[tuple[str, list[str], str]]:
    """(case id, argv, what the error line must name)."""
    for command, flags in NUMERIC.items():
        for flag in flags:
            for i, value in enumerate(NUMBERS):
                yield f"{command} {flag} #{i}", [*BASE[command], flag, value], flag
    for command, flags in TEXTUAL.items():
        for flag in flags:
            for i, value in enumerate(TEXTS):
                yield f"{command} {flag} #{i}", [*BASE[command], flag, value], flag
    for command in ("launch", "demo"):
        for i, value in enumerate(PROMPTS):
            yield f"{command} --prompt #{i}", [*BASE[command], "--prompt", value], "--prompt"
    for command, (head, tail, name) in POSITIONAL.items():
        for i, value in enumerate(TEXTS):
            if value.startswith("-"):
                continue
            yield f"{command} {name} #{i}", [*head, value, *tail], name


FLAG_CASES = list(_flag_cases())


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run main(argv) in-process; assert exit 2, one line, nothing on stdout; the line."""
    started = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2, (argv, err)
    assert out == "", (argv, out)
    assert err.endswith("\n") and err.count("\n") == 1, (argv, err)
    assert err.startswith("mlx-cluster: error: ") and "Traceback" not in err, (argv, err)
    assert elapsed < CASE_TIMEOUT_S, (argv, elapsed)
    assert len(err) < 1100, (argv[:3], len(err))  # a huge value is never echoed whole
    return err


def test_every_hostile_flag_value_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One test over every case: a parametrized test per case would cost more in pytest than
    # the cases themselves.
    assert len(FLAG_CASES) > 500
    for case, argv, name in FLAG_CASES:
        err = _refused(capsys, argv)
        assert name in err, (case, err)
        assert len(err) < 600, (case, len(err))  # a 100 000-character value is not echoed


def test_each_command_is_covered() -> None:
    """Every command `mlx-cluster --help` lists has hostile cases here."""
    commands = set(cli.list_commands(click.Context(cli)))
    covered = {argv[0] for _, argv, _ in FLAG_CASES}
    assert commands == covered | {"topology"}, commands ^ covered
    assert {argv[1] for _, argv, _ in FLAG_CASES if argv[0] == "topology"} == {"check", "snapshot"}


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--no-such-flag\nx"],  # click quotes an unknown flag as typed
        ["launch", "--" + "x" * 100_000],
        ["launch", *BASE["launch"][1:], "extra\x1barg"],
        ["no-such-command\n"],
        ["topology", "nope\r"],
        ["launch", *BASE["launch"][1:], "--job-option", "x=" + "[" * 5000],  # RecursionError
        ["launch", *BASE["launch"][1:], "--job-option", "x=" + "1" * 20_000],
        ["launch", *BASE["launch"][1:], "--strategy", "\x00"],
        ["tiny-model", f"{NOWHERE}/m", "--family", "\udcff"],
        [*BASE["import-gguf"], "--dtype", "bfloat16\n"],
        [*BASE["import-gguf"]],  # a GGUF file that does not exist
    ],
)
def test_other_hostile_arguments_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    _refused(capsys, argv)


def test_temp_nan_and_inf_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("nan", "inf", "-inf", "+inf", "1e-45", "1e400"):
        err = _refused(capsys, [*BASE["launch"], "--temp", value])
        assert "--temp must be" in err, err


def test_plan_out_must_name_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _refused(capsys, [*BASE["plan"], "--out", ""])
    assert "--out must not be empty" in err
    (tmp_path / "file").write_text("x")
    err = _refused(capsys, [*BASE["plan"], "--out", str(tmp_path / "file")])
    assert "exists and is not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_seed_range_is_what_mlx_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, [*BASE["launch"], "--seed", str(2**64)])
    assert "--seed must be at most 18446744073709551615" in err
    # The largest seed passes click and stops only at the missing model.
    main([*BASE["launch"], "--seed", str(2**64 - 1)])
    err = capsys.readouterr().err
    assert "--seed" not in err and NOWHERE in err


def test_an_unexpected_error_is_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    @click.command("boom")
    def boom() -> None:
        raise RecursionError("deep\nand more")

    monkeypatch.setitem(cli.commands, "boom", boom)
    monkeypatch.delenv("MLX_CLUSTER_DEBUG", raising=False)
    assert main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (RecursionError: deep)" in err


def _run(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [MLX_CLUSTER, *argv], capture_output=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ((*BASE["launch"][:4], b"/tmp/\xff\xfe", "--prompt", "hi"), b"--model must be UTF-8"),
        ((*BASE["launch"], "--prompt", b"caf\xe9"), b"--prompt must be UTF-8"),
        (("tiny-model", b"/tmp/\xffmodel"), b"DIRECTORY must be UTF-8"),
        (("import-gguf", b"/tmp/\xff.gguf", "/tmp/m"), b"FILE.gguf must be UTF-8"),
        (("topology", "check", "--hosts", b"a,\xc3"), b"--hosts must be UTF-8"),
        ((*BASE["launch"], "--temp", "nan"), b"--temp must be"),
        ((*BASE["serve"], "--port", str(10**30)), b"--port must be at most 65535"),
    ],
)
def test_real_processes_refuse_in_one_line(argv: tuple[str | bytes, ...], names: bytes) -> None:
    done = _run(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stdout == b""
    assert done.stderr.count(b"\n") == 1 and b"Traceback" not in done.stderr, done.stderr
    assert names in done.stderr, done.stderr
