#!/usr/bin/env python3
"""`mlx-cluster serve` next to mlx-lm's own server: same model, same 2 ranks, one run.

    .venv/bin/python scripts/bench_serve.py [--reps 3] [--concurrency 1 4 8 16] [--per-client 2]
        [--max-tokens 48] [--prefix-tokens 1000] [--conversations 2] [--one-at-a-time]
        [--layers 8 --hidden 512 --heads 8 --kv-heads 4] [--json PATH] [--cli MLX_CLUSTER]

A tiny-but-real random-weight llama is built offline (8 layers, hidden 512, 8 heads / 4 KV heads).
Both servers run on 2 local ranks, tensor parallel, ring backend over 127.0.0.1:
  ours:   `mlx-cluster serve --local 2 --model DIR --port 0` (its default flags)
  mlx-lm: two `python -m mlx_lm.server` ranks started directly with MLX_RANK / MLX_HOSTFILE (not
          through mlx.launch, whose I/O loop spins on a core); rank 0 serves HTTP; its defaults
          (tensor parallel, --decode-concurrency 32, --prompt-concurrency 8).
By default both stay up for the whole run and every round is interleaved: per repetition, per
concurrency c, ours then mlx-lm (the order alternates each repetition). An idle server's ranks
spin in a collective, though (each takes a core), so on a machine with few cores a round shares
the CPU with the other, idle server; --one-at-a-time instead starts one server per repetition,
runs all its rounds, stops it, then does the same for the other (a reload per server and
repetition, the order still alternating). Each start is followed by an unrecorded warm-up.
A round: c clients at once, each sending --per-client streamed chat completions one after the
other (temperature 0, --max-tokens), every prompt fresh (a serial number and random words first;
the same prompts go to both servers), through the official `openai` client with its default 2
retries (counted by cause; a request still refused with 429 is counted as rejected). Per
request: time to the first content chunk (TTFT), the gaps between content chunks (ITL), the
time per output token after the first (TPOT: first to last content chunk / (tokens - 1); a
chunk can carry several tokens, as servers hold back tokens that end mid UTF-8 character) and the
completion tokens from the stream's usage chunk (`stream_options.include_usage`; content chunks
are counted only if a server sends no usage, and the notes say so). Aggregate tok/s = completion
tokens of the round / its wall time. Random weights may end a reply early, so the table also
gives the mean completion tokens per request.
Multi-turn: a system message of >= --prefix-tokens tokens (varied sentences, counted with the
model's tokenizer, fresh text each repetition) and a question (turn 1: a cache miss), then all of
it again with the answer and a second question (turn 2: a server that keeps the prefix answers
sooner); --conversations of them per repetition, one client.
Prints a markdown table (medians over repetitions of each round's figures; ours, mlx-lm, ratio
ours/mlx-lm: above 1 is better for tok/s, below 1 for latencies) and the machine line; --json
PATH keeps every request's figures too. A failure (a server exits, errs or stalls) ends the run
with the servers' log tails and the partial figures. Every server process is stopped at the end,
also on Ctrl-C, SIGTERM or an error. New kinds of rounds (e.g. `response_format` json_schema):
add a RoundKind to ROUND_KINDS; run_round() takes the request kwargs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
PY = str(BIN / "python")
CLI = str(BIN / "mlx-cluster")
RANKS = 2
READY_LINE = re.compile(r"mlx-cluster: serving .* at (http://\S+/v1)")
STOP_GRACE_S = 20.0  # ours stops its ranks on SIGTERM (15 s grace) before exiting
LOG_TAIL_CHARS = 3000

Message = dict[str, str]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Words for prompts and the long system messages: varied, so the text is not one repeated token.
WORDS = _words(
    "river mountain cable memory token layer rank cluster window light morning quiet sea wind "
    "forest city market engine signal bridge harbor garden winter summer number letter paper "
    "copper silver glass stone cloud storm valley island planet orbit spring matrix vector "
    "kernel buffer socket thread packet router switch laptop screen keyboard battery charger "
    "pencil notebook library teacher student doctor farmer baker painter writer sailor pilot "
    "apple orange lemon cherry bread cheese coffee tea honey salt pepper butter rice noodle"
)
ADJECTIVES = _words(
    "small large quiet bright dark fast slow warm cold old new green blue red golden heavy light "
    "careful curious patient gentle silent busy sharp round narrow wide"
)
VERBS = _words(
    "carries reads writes splits shares moves holds finds builds counts sends measures watches "
    "follows opens closes crosses paints cooks teaches"
)


class BenchError(Exception):
    """A failure that ends the run: the message says what, where and which server."""


# ---------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import mlx.core as mx

    from launcher.bench.machine import machine_info  # the chip's name, as `bench` reports it

    cpu = machine_info()["chip"]

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "system": platform.system(),
        "device": "GPU (Metal)" if mx.metal.is_available() else "CPU",
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "openai": version("openai"),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['system']}, MLX {m['mlx']} on {m['device']}, "
        f"mlx-lm {m['mlx_lm']}, openai client {m['openai']}"
    )


# -------------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    try:  # Linux: the kernel's own list, per thread
        found: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    except OSError:
        pass
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(c) for c in done.stdout.split()]


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _started(pid: int) -> str | None:
    """When the process started (Linux: field 22 of /proc/PID/stat), to tell a pid that was
    reused apart from the one we saw; None where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class Proc:
    """One process we started, leader of its own process group, output in log files."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path
    known: dict[int, str | None] = field(default_factory=dict)  # descendant -> its start time

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def remember_children(self) -> None:
        if self.running:
            for pid in _descendants(self.popen.pid):
                self.known.setdefault(pid, _started(pid))

    def tail(self) -> str:
        parts = []
        for path in (self.out, self.err):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                parts.append(f"--- {path.name} (last lines)\n{text[-LOG_TAIL_CHARS:].rstrip()}")
        return "\n".join(parts) or "(no output)"


def start_proc(name: str, argv: list[str], logs: Path, env: dict[str, str] | None = None) -> Proc:
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:
        popen = subprocess.Popen(
            argv,
            cwd=logs,  # not the checkout: `python -m` would import from it, whatever --cli says
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own group: signals reach it and its children alike
        )
    return Proc(name, popen, out, err)


def stop_procs(procs: list[Proc]) -> None:
    """SIGTERM every group, wait for a graceful exit, then SIGKILL whatever is left: the groups
    and every descendant seen (ours starts its ranks in sessions of their own)."""
    for p in procs:
        p.remember_children()
    for p in procs:
        if p.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.running:
            p.remember_children()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait(timeout=10)
    time.sleep(0.5)  # ranks notice their launcher's exit (stdin EOF) and leave on their own
    for p in procs:
        for pid, started in sorted(p.known.items()):
            if _alive(pid) and _started(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of these processes so far (Linux /proc only)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            if platform.system() != "Linux":
                return None
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


# ---------------------------------------------------------------------------------- servers


@dataclass
class Server:
    name: str  # "mlx-cluster" or "mlx-lm"
    base_url: str  # .../v1
    model: str  # the "model" field of its requests
    procs: list[Proc]

    def pids(self) -> list[int]:
        out = []
        for p in self.procs:
            p.remember_children()
            if p.running:
                out.append(p.popen.pid)
            out += [pid for pid, t in p.known.items() if _alive(pid) and _started(pid) == t]
        return sorted(set(out))

    def check_alive(self) -> None:
        for p in self.procs:
            if not p.running:
                raise BenchError(
                    f"{self.name}: process {p.name} exited with code {p.popen.returncode}\n"
                    f"{p.tail()}"
                )

    def logs(self) -> str:
        return "\n".join(f"[{p.name}]\n{p.tail()}" for p in self.procs)


def start_ours(cli: str, model: Path, logs: Path, procs: list[Proc]) -> Proc:
    argv = [cli, "serve", "--local", str(RANKS), "--model", str(model), "--port", "0"]
    proc = start_proc("mlx-cluster-serve", argv, logs)
    procs.append(proc)
    return proc


def wait_ours(proc: Proc, model: Path, timeout: float) -> Server:
    """Wait for serve's ready line on stdout ("mlx-cluster: serving MODEL at URL ...")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = READY_LINE.search(proc.out.read_text(errors="replace"))
        if found:
            proc.remember_children()
            return Server("mlx-cluster", found.group(1), str(model), [proc])
        if not proc.running:
            raise BenchError(
                f"mlx-cluster serve exited with code {proc.popen.returncode} before it was "
                f"ready\n{proc.tail()}"
            )
        time.sleep(0.2)
    raise BenchError(f"mlx-cluster serve not ready after {timeout:.0f} s\n{proc.tail()}")


def start_theirs(model: Path, logs: Path, procs: list[Proc]) -> tuple[list[Proc], int]:
    hostfile = logs / "mlx-lm-ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(RANKS)]))
    port = _free_port()
    argv = [PY, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    started = []
    for rank in range(RANKS):
        env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        proc = start_proc(f"mlx-lm-rank{rank}", argv, logs, env)
        procs.append(proc)
        started.append(proc)
    return started, port


def wait_theirs(ranks: list[Proc], port: int, timeout: float) -> Server:
    """Wait for rank 0's /health to answer 200 (the model still loads in the background: the
    warm-up round waits for that)."""
    server = Server("mlx-lm", f"http://127.0.0.1:{port}/v1", "default_model", ranks)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.3)
    raise BenchError(f"mlx-lm server: /health not answering after {timeout:.0f} s\n{server.logs()}")


# --------------------------------------------------------------------------------- requests


class RetryCounter(logging.Handler):
    """Counts the openai client's own retries by cause, from its log: it logs the cause
    ("Encountered ...", DEBUG) and then "Retrying request ..." (INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.causes: dict[str, int] = {}
        self._last = "unknown"

    def emit(self, record: logging.LogRecord) -> None:
        msg, args = record.msg, record.args
        if not isinstance(msg, str):
            return
        if msg.startswith("Encountered") and isinstance(args, tuple) and args:
            self._last = f"HTTP {args[0]}" if "status error" in msg else str(args[0])
        elif msg.startswith("Retrying request"):
            self.causes[self._last] = self.causes.get(self._last, 0) + 1


RETRIES = RetryCounter()


@dataclass
class RequestResult:
    client: int
    start_s: float  # since the round's start
    end_s: float
    ttft_s: float | None  # None: no content chunk at all
    itl_s: list[float]  # gaps between consecutive content chunks
    content_chunks: int
    usage_tokens: int | None  # completion_tokens of the usage chunk, if the server sent one
    finish_reason: str | None
    text: str
    rejected: bool = False  # still 429 after the client's retries

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.content_chunks

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: a server holds back the tokens that end in the
        middle of a UTF-8 character (random weights make many), so a chunk may carry several."""
        return sum(self.itl_s) / (self.tokens - 1) if self.tokens > 1 and self.itl_s else None


@dataclass
class RoundResult:
    server: str
    kind: str
    concurrency: int
    rep: int
    wall_s: float
    retries: dict[str, int]  # the client's retries by cause: "HTTP 429", "ConnectError"...
    requests: list[RequestResult]

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.requests if not r.rejected]
        tokens = sum(r.tokens for r in done)
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        itl = [gap for r in done for gap in r.itl_s]
        return {
            "tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "ttft_p50": percentile(ttft, 50),
            "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50),
            "itl_p99": percentile(itl, 99),
            "tpot_p50": percentile([t for r in done if (t := r.tpot_s) is not None], 50),
            "mean_tokens": tokens / len(done) if done else None,
            "completion_tokens": tokens,
            "token_source": "usage" if all(r.usage_tokens is not None for r in done) else "chunks",
            "requests": len(self.requests),
            "rejected": len(self.requests) - len(done),
            "retries": sum(self.retries.values()),
            "retry_causes": self.retries,
            "wall_s": self.wall_s,
        }


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def stream_chat(
    client: Any,
    server: Server,
    messages: list[Message],
    max_tokens: int,
    request_kwargs: dict[str, Any],
    t0: float,
    client_index: int,
) -> RequestResult:
    """One streamed chat completion; times taken on the benchmark's side of the socket."""
    import openai

    start = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=server.model,
            messages=messages,
            temperature=0.0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **request_kwargs,
        )
    except openai.RateLimitError:
        now = time.perf_counter()
        return RequestResult(client_index, start - t0, now - t0, None, [], 0, None, None, "", True)
    first: float | None = None
    last: float | None = None
    gaps: list[float] = []
    chunks = 0
    usage: int | None = None
    finish: str | None = None
    text: list[str] = []
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.finish_reason:
                finish = choice.finish_reason
            if choice.delta is not None and choice.delta.content:
                chunks += 1
                text.append(choice.delta.content)
                if first is None:
                    first = now
                if last is not None:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    ttft = None if first is None else first - start
    return RequestResult(
        client_index, start - t0, end - t0, ttft, gaps, chunks, usage, finish, "".join(text)
    )


async def run_round(
    client: Any,
    server: Server,
    conversations: list[list[list[Message]]],
    max_tokens: int,
    request_kwargs: dict[str, Any],
    timeout: float,
    *,
    kind: str = "plain",
    rep: int = 0,
) -> RoundResult:
    """The extension point: one round against one server. `conversations[i]` is client i's list
    of requests (message lists), sent one after the other; all clients start at once.
    `request_kwargs` go into every `chat.completions.create` call as they are, e.g.
    {"response_format": {"type": "json_schema", "json_schema": {...}}} for a structured-output
    round (add a RoundKind below)."""
    server.check_alive()
    RETRIES.causes = {}
    t0 = time.perf_counter()

    async def one_client(i: int) -> list[RequestResult]:
        return [
            await stream_chat(client, server, messages, max_tokens, request_kwargs, t0, i)
            for messages in conversations[i]
        ]

    label = f"{server.name}, {kind} round, {len(conversations)} clients"
    try:  # a TaskGroup: the first failure cancels the other clients and waits for them
        async with asyncio.timeout(timeout), asyncio.TaskGroup() as group:
            tasks = [group.create_task(one_client(i)) for i in range(len(conversations))]
    except TimeoutError:
        raise BenchError(f"{label}: no answer within {timeout:.0f} s\n{server.logs()}") from None
    except ExceptionGroup as group_error:  # the openai client's: connection lost, 5xx, timeout
        e = group_error.exceptions[0]
        dead = "; a server process has exited" if any(not p.running for p in server.procs) else ""
        raise BenchError(f"{label}: {type(e).__name__}: {e}{dead}\n{server.logs()}") from e
    per_client = [t.result() for t in tasks]
    wall = time.perf_counter() - t0
    requests = [r for results in per_client for r in results]
    return RoundResult(server.name, kind, len(conversations), rep, wall, RETRIES.causes, requests)


# ---------------------------------------------------------------------------------- prompts


class Prompts:
    """Prompts no other request of the run shares: a unique number and random words first."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = 0

    def question(self) -> str:
        self.serial += 1
        words = " ".join(self.rng.choice(WORDS) for _ in range(8))
        return f"{self.serial} {words}: what do they have in common? Answer briefly."

    def sentence(self) -> str:
        r = self.rng
        return (
            f"The {r.choice(ADJECTIVES)} {r.choice(WORDS)} {r.choice(VERBS)} "
            f"{r.randint(2, 999)} {r.choice(ADJECTIVES)} {r.choice(WORDS)}s near the "
            f"{r.choice(WORDS)} of the {r.choice(ADJECTIVES)} {r.choice(WORDS)}."
        )

    def system(self, tokenizer: Any, min_tokens: int) -> tuple[str, int]:
        """A system message of at least `min_tokens` tokens (counted with the model's own
        tokenizer), made of varied sentences."""
        head = f"You are assistant number {self.rng.randint(1, 10**9)}. Background notes follow."
        sentences = [head]
        count = len(tokenizer.encode(head).ids)
        while count < min_tokens:
            sentences += [self.sentence() for _ in range(8)]
            count = len(tokenizer.encode(" ".join(sentences)).ids)
        return " ".join(sentences), count


# -------------------------------------------------------------------------------------- run


@dataclass(frozen=True)
class RoundKind:
    """A kind of round; its `request_kwargs` go into every request (see run_round)."""

    name: str
    request_kwargs: dict[str, Any] = field(default_factory=dict)
    servers: tuple[str, ...] = ("mlx-cluster", "mlx-lm")
    concurrency: tuple[int, ...] | None = None  # None: every --concurrency

    def levels(self, args: argparse.Namespace) -> list[int]:
        return [c for c in args.concurrency if self.concurrency is None or c in self.concurrency]


# Constrained decoding's cost, ours only (mlx-lm's server has no response_format): bounded
# fields, so a random model can finish the object within --max-tokens.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 40},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["sea", "mountain", "city"]}, "maxItems": 3},
    },
    "required": ["answer", "confidence", "tags"],
    "additionalProperties": False,
}
JSON_KWARGS = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
    }
}
ROUND_KINDS = (
    RoundKind("plain"),
    RoundKind("json_schema", JSON_KWARGS, servers=("mlx-cluster",), concurrency=(1, 8)),
)


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def ordered(names: tuple[str, str], rep: int) -> tuple[str, str]:
    return names if rep % 2 == 0 else (names[1], names[0])


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Conversation:
    system: str
    system_tokens: int
    first: str
    second: str


@dataclass(frozen=True)
class RepPrompts:
    """One repetition's fresh prompts, the same for both servers (the same work; each server has
    its own caches, so neither sees a prompt twice)."""

    rounds: dict[tuple[str, int], list[list[list[Message]]]]  # (kind, c) -> per client requests
    conversations: list[Conversation]


def rep_prompts(prompts: Prompts, tokenizer: Any, args: argparse.Namespace) -> RepPrompts:
    rounds = {
        (kind.name, c): [
            [[user(prompts.question())] for _ in range(args.per_client)] for _ in range(c)
        ]
        for kind in ROUND_KINDS
        for c in kind.levels(args)
    }
    conversations = []
    for _ in range(args.conversations):
        system, count = prompts.system(tokenizer, args.prefix_tokens)
        conversations.append(Conversation(system, count, prompts.question(), prompts.question()))
    return RepPrompts(rounds, conversations)


class Bench:
    """Starts, warms up and stops the servers; runs the schedule; keeps every result."""

    NAMES = ("mlx-cluster", "mlx-lm")

    def __init__(
        self, args: argparse.Namespace, model: Path, logs: Path, procs: list[Proc], tokenizer: Any
    ) -> None:
        self.args, self.model, self.logs, self.procs = args, model, logs, procs
        self.tokenizer = tokenizer
        self.prompts = Prompts(args.seed)
        self.servers: dict[str, Server] = {}
        self.clients: dict[str, Any] = {}
        self.rounds: list[RoundResult] = []
        self.turns: list[dict[str, Any]] = []
        self.idle: dict[str, float | None] = {}
        self.ready_s: dict[str, list[float]] = {name: [] for name in self.NAMES}

    async def run(self) -> None:
        logging.getLogger("openai").addHandler(RETRIES)
        logging.getLogger("openai").setLevel(logging.DEBUG)
        logging.getLogger("openai").propagate = False
        try:
            if not self.args.one_at_a_time:
                await self.up(self.NAMES)
            for rep in range(self.args.reps):
                todo = rep_prompts(self.prompts, self.tokenizer, self.args)
                order = ordered(self.NAMES, rep)
                if self.args.one_at_a_time:
                    for name in order:
                        await self.up((name,))
                        for kind in ROUND_KINDS:
                            if name not in kind.servers:
                                continue
                            for c in kind.levels(self.args):
                                await self.round(name, rep, kind, todo.rounds[kind.name, c])
                        for i, case in enumerate(todo.conversations):
                            await self.conversation(name, rep, i, case)
                        await self.down(name)
                    continue
                for kind in ROUND_KINDS:
                    for c in kind.levels(self.args):
                        for name in order:
                            if name in kind.servers:
                                await self.round(name, rep, kind, todo.rounds[kind.name, c])
                for i, case in enumerate(todo.conversations):
                    for name in order:
                        await self.conversation(name, rep, i, case)
        finally:
            for client in self.clients.values():
                await client.close()

    async def up(self, names: tuple[str, ...]) -> None:
        """Start these servers (loading side by side), wait until ready, warm them up, and the
        first time, measure how much CPU they burn while idle."""
        import openai

        began = time.monotonic()
        started: dict[str, Any] = {}
        for name in names:
            if name == "mlx-cluster":
                started[name] = start_ours(self.args.cli, self.model, self.logs, self.procs)
            else:
                started[name] = start_theirs(self.model, self.logs, self.procs)
        for name in names:
            if name == "mlx-cluster":
                server = wait_ours(started[name], self.model, self.args.start_timeout)
            else:
                ranks, port = started[name]
                server = wait_theirs(ranks, port, self.args.start_timeout)
            self.servers[name] = server
            self.clients[name] = openai.AsyncOpenAI(
                base_url=server.base_url,
                api_key="unused",
                timeout=self.args.request_timeout,
                max_retries=self.args.max_retries,
            )
        for name in names:
            # Not recorded: mlx-lm loads its weights here; both compile their batched paths.
            for c in (1, 4):
                convs = [[[user(self.prompts.question())]] for _ in range(c)]
                await run_round(
                    self.clients[name], self.servers[name], convs, 8, {},
                    self.args.start_timeout, kind="warm-up",
                )  # fmt: skip
            took = time.monotonic() - began
            self.ready_s[name].append(took)
            progress(f"{name} ready at {self.servers[name].base_url} ({took:.1f} s incl. warm-up)")
        fresh = tuple(self.servers[n] for n in names if n not in self.idle)
        if fresh:
            self.idle |= await asyncio.to_thread(idle_cpu, fresh, self.args.idle_probe)
            for server in fresh:
                if (share := self.idle[server.name]) is not None:
                    progress(f"{server.name} idle: its processes use {100 * share:.0f}% of a core")

    async def down(self, name: str) -> None:
        await self.clients.pop(name).close()
        server = self.servers.pop(name)
        stop_procs(server.procs)
        for p in server.procs:
            self.procs.remove(p)

    async def round(
        self, name: str, rep: int, kind: RoundKind, convs: list[list[list[Message]]]
    ) -> None:
        server, args = self.servers[name], self.args
        result = await run_round(
            self.clients[name], server, convs, args.max_tokens, kind.request_kwargs,
            args.round_timeout, kind=kind.name, rep=rep,
        )  # fmt: skip
        self.rounds.append(result)
        s = result.summary()
        progress(
            f"rep {rep + 1} {kind.name} c={len(convs):<2} {name:<11} {fmt(s['tok_s'], 1, 7)} "
            f"tok/s  TTFT p50 {fmt(s['ttft_p50'], 1000)} ms  ITL p50 {fmt(s['itl_p50'], 1000)} "
            f"ms  {fmt(s['mean_tokens'])} tokens/req"
            + (f"  {s['retries']} retries" if s["retries"] else "")
            + (f"  {s['rejected']} REJECTED (429)" if s["rejected"] else "")
        )

    async def conversation(self, name: str, rep: int, i: int, case: Conversation) -> None:
        """Turn 1: system + question (a cache miss); turn 2: all of it again with the answer and
        a second question (a server that keeps the prefix answers it sooner)."""
        server, client, args = self.servers[name], self.clients[name], self.args
        first = [{"role": "system", "content": case.system}, user(case.first)]
        one = await run_round(
            client, server, [[first]], args.max_tokens, {}, args.round_timeout, kind="turn-1"
        )
        answer = one.requests[0]
        progress(
            f"rep {rep + 1} multi-turn {i + 1} {name:<11} system {case.system_tokens} tokens: "
            f"TTFT turn 1 {fmt(answer.ttft_s, 1000)} ms"
        )
        second = [*first, {"role": "assistant", "content": answer.text}, user(case.second)]
        two = await run_round(
            client, server, [[second]], args.max_tokens, {}, args.round_timeout, kind="turn-2"
        )
        turn: dict[str, Any] = {
            "server": name, "rep": rep, "conversation": i, "system_tokens": case.system_tokens,
            "ttft_1": answer.ttft_s, "ttft_2": two.requests[0].ttft_s,
            "tokens_1": answer.tokens, "tokens_2": two.requests[0].tokens,
            "rejected": answer.rejected or two.requests[0].rejected,
        }  # fmt: skip
        self.turns.append(turn)
        progress(f"{'':>28} turn 2 {fmt(turn['ttft_2'], 1000)} ms")

    def result(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "turns": self.turns,
            "idle_cpu": self.idle,
            "ready_s": self.ready_s,
        }


def idle_cpu(servers: tuple[Server, ...], seconds: float) -> dict[str, float | None]:
    """Share of a core each server's processes use while nobody asks them anything: with both
    up for the whole run, an idle server that spins slows the other one down."""
    pids = {s.name: s.pids() for s in servers}
    before = {name: cpu_seconds(p) for name, p in pids.items()}
    time.sleep(seconds)
    after = {name: cpu_seconds(p) for name, p in pids.items()}
    out: dict[str, float | None] = {}
    for name in pids:
        b, a = before[name], after[name]
        out[name] = None if a is None or b is None else (a - b) / seconds
    return out


# ------------------------------------------------------------------------------------ report


def fmt(x: float | None, scale: float = 1.0, width: int = 0) -> str:
    return f"{'-' if x is None else f'{x * scale:.1f}':>{width}}"


def median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


SUMMARIZED = ("tok_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "mean_tokens")


def summarize(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Medians over repetitions of each round's figures, per (kind, concurrency, server)."""
    rounds: list[RoundResult] = result["rounds"]
    out: dict[str, Any] = {"rounds": {}, "multi_turn": {}}
    for kind in ROUND_KINDS:
        for c in kind.levels(args):
            key = f"{kind.name}/c{c}"
            out["rounds"][key] = {}
            for name in kind.servers:
                sums = [
                    r.summary()
                    for r in rounds
                    if r.server == name and r.kind == kind.name and r.concurrency == c
                ]
                med: dict[str, Any] = {m: median([s[m] for s in sums]) for m in SUMMARIZED}
                med["rejected"] = sum(s["rejected"] for s in sums)
                med["retries"] = sum(s["retries"] for s in sums)
                causes: dict[str, int] = {}
                for s in sums:
                    for cause, n in s["retry_causes"].items():
                        causes[cause] = causes.get(cause, 0) + n
                med["retry_causes"] = causes
                med["token_source"] = sorted({s["token_source"] for s in sums})
                out["rounds"][key][name] = med
    for name in ("mlx-cluster", "mlx-lm"):
        mine = [t for t in result["turns"] if t["server"] == name]
        per_rep: dict[str, list[float | None]] = {"ttft_1": [], "ttft_2": []}
        for rep in range(args.reps):
            in_rep = [t for t in mine if t["rep"] == rep]
            for m in per_rep:
                per_rep[m].append(median([t[m] for t in in_rep]))
        out["multi_turn"][name] = {m: median(v) for m, v in per_rep.items()}
    return out


def table(summary: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = [
        "| metric (median over reps) | mlx-cluster | mlx-lm | ours / mlx-lm |",
        "|---|---:|---:|---:|",
    ]

    def row(label: str, ours: float | None, theirs: float | None, scale: float, fmt: str) -> None:
        ratio = "-" if not ours or not theirs else f"{ours / theirs:.2f}x"
        a = "-" if ours is None else format(ours * scale, fmt)
        b = "-" if theirs is None else format(theirs * scale, fmt)
        lines.append(f"| {label} | {a} | {b} | {ratio} |")

    def label(kind: RoundKind, text: str) -> str:
        return text if kind.name == "plain" else f"{text} ({kind.name})"

    metrics = (
        ("tok_s", "aggregate tok/s, {c} client{s}", 1.0, ".1f"),
        ("ttft_p50", "TTFT p50 (ms), {c} client{s}", 1000.0, ".1f"),
        ("ttft_p99", "TTFT p99 (ms), {c} client{s}", 1000.0, ".1f"),
        ("itl_p50", "ITL p50 (ms), {c} client{s}", 1000.0, ".1f"),
        ("itl_p99", "ITL p99 (ms), {c} client{s}", 1000.0, ".1f"),
        ("tpot_p50", "time per output token p50 (ms), {c} client{s}", 1000.0, ".1f"),
        ("mean_tokens", "mean completion tokens, {c} client{s}", 1.0, ".1f"),
    )
    for kind in ROUND_KINDS[:1]:  # the kinds both servers run
        for metric, text, scale, fmt in metrics:
            for c in kind.levels(args):
                pair = summary["rounds"][f"{kind.name}/c{c}"]
                name = label(kind, text.format(c=c, s="" if c == 1 else "s"))
                row(name, pair["mlx-cluster"][metric], pair["mlx-lm"][metric], scale, fmt)
    turns = summary["multi_turn"]
    for metric, text in (("ttft_1", "first-turn TTFT (ms)"), ("ttft_2", "second-turn TTFT (ms)")):
        row(
            f"{text}, {args.prefix_tokens}+ token prefix",
            turns["mlx-cluster"][metric],
            turns["mlx-lm"][metric],
            1000.0,
            ".1f",
        )
    lines += ["", "| ours: constrained decoding | json_schema | plain | json / plain |"]
    lines.append("|---|---:|---:|---:|")
    for kind in ROUND_KINDS[1:]:
        for metric, text, scale, fmt in (metrics[0], metrics[5]):
            for c in kind.levels(args):
                plain = summary["rounds"].get(f"plain/c{c}", {}).get("mlx-cluster", {})
                mine = summary["rounds"][f"{kind.name}/c{c}"]["mlx-cluster"]
                label_c = text.format(c=c, s="" if c == 1 else "s")
                row(label_c, mine[metric], plain.get(metric), scale, fmt)
    return lines


def notes(
    summary: dict[str, Any], result: dict[str, Any], args: argparse.Namespace
) -> Iterator[str]:
    for key, pair in summary["rounds"].items():
        for name, med in pair.items():
            if med["rejected"]:
                yield f"{name}, {key}: {med['rejected']} requests rejected (429) after the retries"
            if med["retries"]:
                causes = ", ".join(f"{c} x{n}" for c, n in sorted(med["retry_causes"].items()))
                yield f"{name}, {key}: the openai client retried {med['retries']} times ({causes})"
            if med["token_source"] not in ([], ["usage"]):
                yield f"{name}, {key}: completion tokens counted as content chunks (no usage)"
    spins = []
    for name, share in result["idle_cpu"].items():
        if share is not None:
            spins.append(f"{name} {100 * share:.0f}%")
    if spins:
        yield "CPU used by each server's processes while idle (% of a core): " + ", ".join(spins)
        worst = max(s for s in result["idle_cpu"].values() if s is not None)
        if not args.one_at_a_time and worst > 0.2 and (os.cpu_count() or 1) <= 8:
            yield (
                "both servers stayed up and an idle one spins on this few-core machine, so each "
                "round shared the CPU with the other server: --one-at-a-time avoids that"
            )
    for name, took in result["ready_s"].items():
        if took:
            yield f"{name}: start to ready after warm-up {statistics.median(took):.1f} s"


def to_json(
    result: dict[str, Any], summary: dict[str, Any], info: dict[str, Any], failure: str | None
) -> Any:
    return {
        **info,
        "failure": failure,
        "summary": summary,
        "idle_cpu_share": result["idle_cpu"],
        "ready_s": result["ready_s"],
        "rounds": [
            {**{k: v for k, v in asdict(r).items() if k != "requests"}, "summary": r.summary(),
             "requests": [asdict(q) for q in r.requests]}
            for r in result["rounds"]
        ],
        "multi_turn": result["turns"],
    }  # fmt: skip


# ------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--per-client", type=int, default=2, help="requests each client sends in turn")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1000, help="multi-turn system message")
    p.add_argument("--conversations", type=int, default=2, help="multi-turn cases per rep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-retries", type=int, default=2, help="the openai client's (default 2)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to get ready")
    p.add_argument("--request-timeout", type=float, default=120.0, help="openai client timeout")
    p.add_argument("--round-timeout", type=float, default=600.0)
    p.add_argument("--idle-probe", type=float, default=2.0, help="seconds of idle CPU probe")
    p.add_argument("--cli", default=CLI, help="the mlx-cluster executable (default: the venv's)")
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="per repetition, start one server, run all its rounds, stop it, then the other\n"
        "(an idle server's ranks spin in a collective; on a few-core machine that slows the\n"
        "other one down; this costs a reload per server and repetition)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write raw and summary figures")
    args = p.parse_args()
    if args.reps < 1 or args.per_client < 1 or min(args.concurrency) < 1:
        p.error("--reps, --per-client and --concurrency must be at least 1")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    print(f"bench_serve: signal {signum}; stopping the servers", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    sys.path.insert(0, str(ROOT))
    from tokenizers import Tokenizer

    from cluster.tiny_model import write_tiny_model

    options = vars(args).items()
    settings = {k: v if isinstance(v, int | float | list) else str(v) for k, v in options}
    info: dict[str, Any] = {"machine": machine(), "args": settings}
    began = time.monotonic()
    procs: list[Proc] = []
    failure = None
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        logs = Path(tmp)
        model = write_tiny_model(
            logs / "model", layers=args.layers, hidden=args.hidden, heads=args.heads,
            kv_heads=args.kv_heads, vocab=384,
        )  # fmt: skip
        bench = Bench(args, model, logs, procs, Tokenizer.from_file(str(model / "tokenizer.json")))
        try:
            asyncio.run(bench.run())
        except BenchError as e:
            failure = str(e)
        except KeyboardInterrupt:
            print("bench_serve: interrupted; stopping the servers", file=sys.stderr)
            return 130
        finally:
            stop_procs(procs)
    result = bench.result()
    summary = summarize(result, args)
    info["seconds"] = took = time.monotonic() - began
    mode = "one server up at a time" if args.one_at_a_time else "both servers up all run"
    print(
        f"\nmodel: random-weight llama, {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads; {RANKS} ranks, tensor parallel, ring "
        f"over 127.0.0.1; {args.reps} reps ({mode}); {args.per_client} streamed requests per "
        f"client in turn, max_tokens {args.max_tokens}, temperature 0"
    )
    print(f"machine: {machine_line(info['machine'])}\n")
    print("\n".join(table(summary, args)))
    for note in notes(summary, result, args):
        print(f"- {note}")
    print(f"\n(run took {took:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(to_json(result, summary, info, failure), indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    if failure:
        print(f"\nbench_serve: error (figures above are partial): {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
