"""The object a cut JSON text was becoming: a tool call's arguments cut by max_tokens, for
Anthropic's `tool_use.input` (which must be an object, where OpenAI carries the text as is).

Best effort, by one rule: keep every complete member, close an open string, drop what cannot
stand alone (a key without its value, a half-written number, literal or escape), then close
the open containers. `{"city": "Par` is {"city": "Par"}; `{"city": "Paris", "un` is
{"city": "Paris"}.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
CLOSERS = {"{": "}", "[": "]"}


@dataclass(frozen=True)
class Token:
    kind: str  # "open" | "close" | "," | ":" | "string" | "scalar"
    text: str
    key: bool = False  # a string in an object where a key goes
    whole: bool = True  # a string with its closing quote


def _string_end(text: str, i: int) -> int:
    """Index after the string starting at i (len(text) + 1 when it is not closed)."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    return len(text) + 1


def _tokens(text: str) -> tuple[list[Token], list[str]]:
    """The text's tokens and the containers still open (None of either when it is not JSON)."""
    tokens: list[Token] = []
    stack: list[str] = []
    expect_key = False
    i = 0
    while i < len(text):
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c in "{[":
            tokens.append(Token("open", c))
            stack.append(c)
            expect_key, i = c == "{", i + 1
        elif c in "}]":
            if not stack or CLOSERS[stack.pop()] != c:
                raise ValueError("unbalanced")
            tokens.append(Token("close", c))
            expect_key, i = False, i + 1
        elif c in ",:":
            tokens.append(Token(c, c))
            expect_key, i = c == "," and bool(stack) and stack[-1] == "{", i + 1
        elif c == '"':
            end = _string_end(text, i)
            tokens.append(Token("string", text[i:end], expect_key, end <= len(text)))
            i = end
        else:
            j = i
            while j < len(text) and text[j] not in ' \t\r\n,:]}{["':
                j += 1
            tokens.append(Token("scalar", text[i:j]))
            i = j
    return tokens, stack


def _close_string(s: str) -> str | None:
    """An unclosed string closed, a half escape dropped; None when nothing valid remains."""
    for k in range(len(s), 0, -1):
        candidate = s[:k] + '"'
        try:
            json.loads(candidate)
        except json.JSONDecodeError:
            continue
        return candidate
    return None


def _scalar(s: str) -> str | None:
    """A literal or number as it may stand: a cut one only when it is already valid."""
    if s in ("true", "false", "null"):
        return s
    found = NUMBER.match(s)
    if found is None:
        return None
    return s if found.end() == len(s) else None  # a cut "12." or "1e" is no number yet


def _trim(tokens: list[Token]) -> list[str]:
    """The tokens' text with the cut end made to stand alone."""
    out = [t.text for t in tokens]
    while tokens:
        last = tokens[-1]
        if last.kind in ("open", "close"):
            break
        if last.kind == "string" and not last.key:
            fixed = last.text if last.whole else _close_string(last.text)
            if fixed is not None:
                out[-1] = fixed
                break
        elif last.kind == "scalar" and (fixed := _scalar(last.text)) is not None:
            out[-1] = fixed
            break
        # a key, a ':' or ',' left dangling, a value that cannot be closed: drop it (and a
        # value's key with it, once its ':' goes)
        tokens, out = tokens[:-1], out[:-1]
        if last.kind == ":" and tokens and tokens[-1].kind == "string":
            tokens, out = tokens[:-1], out[:-1]
        elif last.kind not in (",", ":") and tokens and tokens[-1].kind == ":":
            tokens, out = tokens[:-2], out[:-2]
    return out


def partial_object(text: str) -> dict[str, Any]:
    """The object `text` is or was becoming; {} when it is not the start of a JSON object."""
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    else:
        return whole if isinstance(whole, dict) else {}
    try:
        tokens, stack = _tokens(text)
    except ValueError:
        return {}
    if not tokens or tokens[0].text != "{":
        return {}
    body = "".join(_trim(tokens))  # trimming drops no container: the stack still holds
    try:
        parsed = json.loads(body + "".join(CLOSERS[c] for c in reversed(stack)))
    except (json.JSONDecodeError, RecursionError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
