"""The parser boundary for everything read from outside: files, agent answers, probe outputs.

Pure (bytes or text in, values out, no I/O, no MLX). Every reader of an untrusted file goes
through here, so one set of rules holds everywhere: a size limit, a nesting-depth limit checked
without recursing, no YAML anchors or aliases (their expansion is how a 380-byte file becomes
gigabytes), UTF-8 errors reported with their byte offset, and numbers range-checked before any
arithmetic. Two layers: `parse_*` raise `Refused` (the reason alone, for callers such as the
probe parsers that turn it into a probe gap) and `load_*` / the getters raise `InputError`
naming the source, which the CLI prints as one line (exit 2).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from topology.errors import InputError, one_line

MAX_DEPTH = 32  # every file here nests a handful of levels; 32 leaves room and recursion is safe
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: much faster
# One JSON token that matters for depth: a whole string (possessive: linear, no backtracking),
# a lone quote (an unterminated string: nothing after it parses), or a bracket.
_JSON_TOKEN = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|"|[\[\]{}]', re.DOTALL)
# YAML tokens that matter for flow depth: quoted scalars ('' escapes a quote), comments, brackets.
_YAML_FLOW_TOKEN = re.compile(
    r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|\'[^\']*+(?:\'\'[^\']*+)*+\'|#[^\n]*+|[\[\]{}]', re.DOTALL
)


class Refused(ValueError):
    """Input refused; the message is the reason alone (the caller names the source)."""


def clean(text: str, limit: int = 60) -> str:
    """`text` fit for a one-line message: control characters escaped, at most `limit` chars."""
    return one_line(text, limit)


def show(value: Any, limit: int = 60) -> str:
    """A short, one-line rendering of any decoded value (huge ints never go through str())."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):  # repr escapes control characters and lone surrogates
        quoted = repr(value[:limit])
        cut = len(value) > limit or len(quoted) > limit + 2  # escapes make it longer
        return quoted[: limit + 1] + "…" + quoted[0] if cut else quoted
    if isinstance(value, dict | list):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    return f"a value of type {type(value).__name__}"


def decode_utf8(data: bytes, source: str) -> str:
    """UTF-8 text, or InputError naming the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{source}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8"
        ) from None


def surrogate_offset(text: str) -> int | None:
    """Where a text decoded with surrogateescape held a byte that is not UTF-8 (None: clean)."""
    m = re.search(r"[\ud800-\udfff]", text)
    return None if m is None else len(text[: m.start()].encode("utf-8", "surrogateescape"))


def _text(data: bytes | str, source: str, max_bytes: int) -> str:
    if len(data) > max_bytes:  # str: characters ≤ bytes, so a str over the limit is over it too
        raise InputError(f"{source}: larger than {max_bytes:,} bytes; not a file this reads")
    return decode_utf8(data, source) if isinstance(data, bytes) else data


def json_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Refused when brackets nest deeper than `limit` — counted, never recursed into."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                raise Refused(f"nested more than {limit} levels deep")
        elif c in "]}":
            depth -= 1
        elif c == '"':
            return  # unterminated string: json.loads stops there too
        # a whole string: skipped


def parse_json(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON value; Refused on bad syntax, too deep nesting or an absurdly long number."""
    json_depth(text, max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Refused(f"not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except ValueError:  # int() refuses numbers of more than 4300 digits
        raise Refused("not valid JSON (a number with thousands of digits)") from None
    except RecursionError:  # cannot happen after json_depth; kept as the last guard
        raise Refused(f"nested more than {max_depth} levels deep") from None


def load_json(data: bytes | str, source: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """parse_json with a size limit and UTF-8 decoding; InputError naming `source`."""
    try:
        return parse_json(_text(data, source, max_bytes), max_depth)
    except Refused as e:
        raise InputError(f"{source}: {e}") from None


def _yaml_flow_depth(text: str) -> int:
    """The deepest nesting of `[` and `{` outside quoted scalars and comments."""
    depth = deepest = 0
    for m in _YAML_FLOW_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _yaml_events_ok(text: str, max_depth: int) -> None:
    """Refuse anchors, aliases and deep nesting from the event stream, before anything is built."""
    try:
        _walk_yaml_events(text, max_depth)
    except yaml.YAMLError:
        # libyaml may look far ahead in flow collections and refuse deep nesting itself, with
        # its own limit and wording (PyYAML 6.0.4): say ours whenever the brackets explain it.
        if _yaml_flow_depth(text) > max_depth:
            raise Refused(f"nested more than {max_depth} levels deep") from None
        raise


def _walk_yaml_events(text: str, max_depth: int) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise Refused("YAML anchors and aliases (& and *) are not allowed; write values out")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise Refused(f"nested more than {max_depth} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_yaml(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """A YAML value (safe types only); Refused on bad syntax, aliases or too deep nesting."""
    bad = surrogate_offset(text)
    if bad is not None:
        raise Refused(f"not UTF-8 text (a bad byte at offset {bad})")
    try:
        _yaml_events_ok(text, max_depth)
        return yaml.load(text, Loader=_LOADER)
    except Refused:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        what = clean(e.problem or "syntax error", 60)
        raise Refused(f"{where}: not valid YAML ({what}); check indentation and quoting") from None
    except yaml.reader.ReaderError as e:
        ch = chr(e.character) if isinstance(e.character, int) else str(e.character)
        raise Refused(f"character {ch!a} at offset {e.position} is not allowed in YAML") from None
    except yaml.YAMLError:
        raise Refused("not valid YAML; check indentation and quoting") from None
    except (ValueError, TypeError, OverflowError):  # a scalar the constructor cannot build
        raise Refused("not valid YAML (a value that is not a number, date or string)") from None
    except RecursionError:  # cannot happen after the depth check; kept as the last guard
        raise Refused(f"nested more than {max_depth} levels deep") from None


def load_yaml(data: bytes | str, source: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """parse_yaml with a size limit and UTF-8 decoding; InputError naming `source`."""
    try:
        return parse_yaml(_text(data, source, max_bytes), max_depth)
    except Refused as e:
        raise InputError(f"{source}: {e}") from None


def _range(lo: float, hi: float) -> str:
    return f"from {lo:,} to {hi:,}" if hi != math.inf else f"of at least {lo:,}"


def integer(value: Any, source: str, key: str, lo: int, hi: int) -> int:
    """An int within [lo, hi] (bools and floats refused); InputError naming source and key."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(
            f"{source}: {key}: must be a whole number {_range(lo, hi)}, got {show(value)}"
        )
    return value


def number(value: Any, source: str, key: str, lo: float, hi: float) -> float:
    """A finite int or float within [lo, hi]; InputError naming source and key."""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    # compare before float(): a huge int would overflow the conversion
    if not ok or (isinstance(value, float) and not math.isfinite(value)) or not lo <= value <= hi:
        raise InputError(f"{source}: {key}: must be a number {_range(lo, hi)}, got {show(value)}")
    return float(value)


def text(
    value: Any, source: str, key: str, pattern: re.Pattern[str], kind: str, max_len: int = 255
) -> str:
    """A string matched whole by `pattern` (no trailing newline slips through `$`)."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{source}: {key}: must be a non-empty string, got {show(value)}")
    if len(value) > max_len:
        raise InputError(f"{source}: {key}: longer than {max_len} characters")
    if not pattern.fullmatch(value):
        raise InputError(
            f"{source}: {key}: {show(value)} is not a valid {kind} "
            "(no spaces, control or shell characters)"
        )
    return value
