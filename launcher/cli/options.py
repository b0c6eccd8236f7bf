"""Shared CLI option types and options: numbers and text checked whole, before anything runs.

One definition each, so every command accepts and refuses the same things the same way. A value
out of range is a click usage error: main.py prints it as one line and exits 2.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from launcher.ranks.supervisor import Deadlines
from topology.cluster_file import BACKENDS, STRATEGIES
from topology.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

SHOWN_CHARS = 40  # how much of a refused value an error line repeats
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = 64  # longer is never a sane number: refused before int() or float() sees it


def shown(value: object) -> str:
    """A value as an error line may repeat it: repr'd (no raw newline), at most SHOWN_CHARS."""
    text = repr(value) if type(value) is str else str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


class BadValue(click.BadParameter):
    """A refused option value, printed as `--flag must be ..., got X` (one line)."""

    def format_message(self) -> str:
        param = self.param
        if isinstance(param, click.Option):
            name = "/".join(param.opts)
        elif param is not None:  # an argument: its metavar, as --help shows it, unbracketed
            name = param.human_readable_name.strip("[]. ")
        else:
            name = "a value"
        return f"{name} {self.message}"


class Number(click.ParamType):
    """An int or a finite float within [low, high] (low excluded when low_open), parsed whole.

    click's FloatRange lets nan through, and int()/float() accept " 5\\n", "1_0" and 4000-digit
    strings; this refuses them all.
    `positive_min`: values in (0, positive_min) are refused too (a temperature of 1e-45 makes
    the sampler's 1/temp infinite).
    """

    def __init__(
        self,
        kind: type[int] | type[float],
        low: float,
        high: float,
        *,
        low_open: bool = False,
        positive_min: float | None = None,
        note: str = "",
    ) -> None:
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open
        self.positive_min, self.note = positive_min, note
        self.name = "integer" if kind is int else "float"

    def _range(self) -> str:
        what = "a whole number" if self.kind is int else "a finite number"
        low = f"above {self.low:g}" if self.low_open else f"{self._fmt(self.low)}"
        return f"{what} from {low} to {self._fmt(self.high)}"

    def _fmt(self, n: float) -> str:
        return str(int(n)) if self.kind is int else f"{n:g}"

    def _fail(self, why: str, value: object, param: Any, ctx: Any) -> BadValue:
        note = f" ({self.note})" if self.note else ""
        return BadValue(f"must be {why}{note}, got {shown(value)}", ctx, param)

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        n = self._parse(value, param, ctx)
        # A parsed string matched the number pattern: safe to repeat as typed ("0", not "0.0").
        typed = NumberText(value) if isinstance(value, str) else n
        if self.kind is float and not math.isfinite(n):
            raise self._fail(self._range(), value, param, ctx)
        if n < self.low or (self.low_open and n == self.low):
            word = "more than" if self.low_open else "at least"
            raise self._fail(f"{word} {self._fmt(self.low)}", typed, param, ctx)
        if n > self.high:
            raise self._fail(f"at most {self._fmt(self.high)}", typed, param, ctx)
        if self.positive_min is not None and 0 < n < self.positive_min:
            raise self._fail(f"0 or at least {self.positive_min:g}", typed, param, ctx)
        return n

    def _parse(self, value: Any, param: Any, ctx: Any) -> int | float:
        if isinstance(value, bool):
            raise self._fail(self._range(), value, param, ctx)
        if isinstance(value, int | float):  # a default, or a caller's value
            return self.kind(value)
        text = str(value)
        pattern = _INT if self.kind is int else _FLOAT
        if len(text) > _NUMBER_CHARS or not pattern.fullmatch(text):  # nan and inf too
            raise self._fail(self._range(), value, param, ctx)
        return self.kind(text)


class NumberText(str):
    """A number as typed: `shown` repeats it without quotes."""


_ALLOWED_IN_LINES = frozenset("\n\t\r")


def _control(c: str, multiline: bool) -> bool:
    if multiline and c in _ALLOWED_IN_LINES:
        return False
    return unicodedata.category(c) == "Cc" or c in "\u2028\u2029"


class Text(click.ParamType):
    """A string checked whole: UTF-8 (no undecodable argv bytes), not empty, no control
    characters (a trailing newline included) unless multiline, at most max_chars."""

    name = "text"

    def __init__(
        self, what: str, *, multiline: bool = False, max_chars: int = 4096, path: bool = False
    ) -> None:
        self.what, self.multiline, self.max_chars, self.path = what, multiline, max_chars, path
        self.name = "path" if path else "text"  # --help's metavar

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str):
            raise BadValue(f"must be {self.what}, got {shown(value)}", ctx, param)
        if any("\ud800" <= c <= "\udfff" for c in value):  # os.fsdecode's undecodable bytes
            raise BadValue(f"must be UTF-8 text ({self.what}), got {shown(value)}", ctx, param)
        if not value:
            raise BadValue(f"must not be empty: give {self.what}", ctx, param)
        if any(_control(c, self.multiline) for c in value):
            raise BadValue(
                f"must not contain control characters such as a newline, got {shown(value)}",
                ctx,
                param,
            )
        if len(value) > self.max_chars:
            raise BadValue(
                f"is too long ({len(value)} characters, at most {self.max_chars}): "
                f"give {self.what}",
                ctx,
                param,
            )
        return Path(value) if self.path else value


# Ranges (the README's table lists them). Tokens: 2^24 covers the longest contexts published.
MAX_TOKENS = 1 << 24
LOCAL = Number(int, 1, 64, note="ranks on this machine")
SEED = Number(int, 0, (1 << 64) - 1)  # what mx.random.seed takes (uint64)
TOKENS = Number(int, 1, MAX_TOKENS)
CONTEXT = Number(int, 1, MAX_TOKENS, note="tokens")
TEMP = Number(float, 0, 10, positive_min=1e-3, note="0 = greedy")
TOP_P = Number(float, 0, 1, low_open=True)
PORT = Number(int, 0, 65535, note="0: any free port")
TIMEOUT_S = Number(float, 0.5, 86400, note="seconds")
MODEL = Text("a model directory or a Hugging Face repo id")
CLUSTER = Text("a cluster file (CLUSTER.yaml)")
HOSTS = Text("comma-separated ssh destinations, e.g. a,b", max_chars=16384)
PROMPT = Text("the prompt", multiline=True, max_chars=1 << 24)
FILE = Text("a file path", path=True)
DIRECTORY = Text("a directory path", path=True)


def check_hosts_source(cluster_file: str | None, local: int | None, backend: str | None) -> None:
    """Exactly one of CLUSTER.yaml or --local N; --local is N ranks over ring on 127.0.0.1."""
    if (cluster_file is None) == (local is None):
        raise InputError("give exactly one of CLUSTER.yaml or --local N")
    check_local(local, backend)


def check_local(local: int | None, backend: str | None) -> None:
    if local is None:
        return
    if local < 1:
        raise InputError(f"--local needs at least 1 rank, got {local}")
    if backend not in (None, "auto", "ring"):
        raise InputError(f"--local runs over ring on 127.0.0.1; --backend {backend} needs hosts")


def check_deadlines(rank_timeout: float, load_timeout: float, stall_timeout: float) -> Deadlines:
    """The deadlines (each already in TIMEOUT_S's range), in the order they apply."""
    if load_timeout < rank_timeout:
        raise InputError("--load-timeout must be at least --rank-timeout")
    if stall_timeout < rank_timeout:
        raise InputError("--stall-timeout must be at least --rank-timeout")
    return Deadlines(
        rank_timeout_s=rank_timeout, load_timeout_s=load_timeout, stall_timeout_s=stall_timeout
    )


JOB_OPTION_CHARS = 10_000  # test hooks are short; a deep JSON nest would hit the recursion limit


def job_options(items: tuple[str, ...]) -> dict[str, Any]:
    """The hidden --job-option KEY=JSON flags (test hooks such as fail_at_token) as a dict."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if len(item) > JOB_OPTION_CHARS:
            raise InputError(f"--job-option {shown(item)}: at most {JOB_OPTION_CHARS} characters")
        try:
            out[key] = json.loads(value) if sep else True
        except (json.JSONDecodeError, RecursionError):
            raise InputError(f"--job-option {shown(item)}: the value must be JSON") from None
    return out


DISCOVER_HELP = "Use the hosts whose `mlx-cluster agent` answers on the local network (mDNS)."


def host_source_options(snapshot_help: str) -> Callable[[F], F]:
    """[CLUSTER.yaml], --hosts, --snapshot and --discover: where a command's hosts come from."""

    def add(f: F) -> F:
        f = click.option("--discover", is_flag=True, help=DISCOVER_HELP)(f)
        f = click.option("--snapshot", type=DIRECTORY, metavar="DIR", help=snapshot_help)(f)
        f = click.option(
            "--hosts", type=HOSTS, metavar="A,B", help="Comma-separated ssh destinations to probe."
        )(f)
        return click.argument("cluster", required=False, metavar="[CLUSTER.yaml]", type=CLUSTER)(f)

    return add


def placement_options(f: F) -> F:
    """--strategy and --backend."""
    f = click.option(
        "--backend", type=click.Choice(BACKENDS), help="Default: the best one available."
    )(f)
    return click.option(
        "--strategy", type=click.Choice(STRATEGIES), help="Default: the cluster's, or auto."
    )(f)


def deadline_options(what: str) -> Callable[[F], F]:
    """--rank-timeout, --stall-timeout and --load-timeout (launcher/ranks/liveness.py)."""

    def add(f: F) -> F:
        f = click.option(
            "--load-timeout",
            type=TIMEOUT_S,
            default=Deadlines.load_timeout_s,
            show_default=True,
            help="Seconds a rank may go quiet or make no progress while the model loads.",
        )(f)
        f = click.option(
            "--stall-timeout",
            type=TIMEOUT_S,
            default=Deadlines.stall_timeout_s,
            show_default=True,
            help=f"Seconds with no progress (at least; more when the job's own steps are slow) "
            f"before {what}.",
        )(f)
        return click.option(
            "--rank-timeout",
            type=TIMEOUT_S,
            default=Deadlines.rank_timeout_s,
            show_default=True,
            help=f"Seconds a rank, its host or one of its links may go silent before {what}.",
        )(f)

    return add


def forbid_hub() -> None:
    """--no-hub on this side: planning reads config.json from the Hub cache only."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the environment then
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]


def speculative_option(f: F) -> F:
    """--speculative on|off (cluster/speculative/)."""
    return click.option(
        "--speculative",
        type=click.Choice(["on", "off"]),
        default="on",
        show_default=True,
        help="Draft tokens from the prompt and the output so far (and from a request's "
        "'prediction') and check them in one forward; the output does not change. off: plain "
        "decoding, one token per forward.",
    )(f)


def draft_model_option(f: F) -> F:
    """--draft-model M (cluster/speculative/draft_model.py; checked: launcher/planning/)."""
    return click.option(
        "--draft-model",
        metavar="M",
        help="A small model of the same vocabulary (directory or Hugging Face repo id) whose "
        "greedy tokens are the drafts where nothing can be copied; loaded whole on rank 0 only. "
        "Default: none (drafts come from the prompt, the output and 'prediction').",
    )(f)


def draft_model_for_ranks(model: str, draft: str | None, speculative: str) -> dict[str, str]:
    """The job option that makes rank 0 load the draft model, checked now (exit 2 if wrong)."""
    if draft is None:
        return {}
    if speculative == "off":
        raise InputError("--draft-model drafts tokens: it needs --speculative on (the default)")
    from launcher.planning.draft_model import check_draft_model

    return {"draft_model": check_draft_model(model, draft)}


def hub_option(f: F) -> F:
    """--no-hub: model files come from the cluster's hosts only (launcher/share/)."""
    return click.option(
        "--no-hub",
        is_flag=True,
        help="Never download from the Hugging Face Hub: files no host of the cluster has "
        "are an error.",
    )(f)
