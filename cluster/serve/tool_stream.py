"""Tool calls read out of the text as it is generated (rank 0, cluster/serve/output.py).

ToolCallText cuts the text at the model's call markers; CallBody reads one call's body, which in
the JSON format (mlx-lm's json_tools, and every forced call) is `{"name": N, "arguments": {...}}`:
the call is announced once its name is read and its arguments stream on as they are generated.
So a client sees a call's arguments grow token by token, and a call cut by max_tokens is still a
call with the arguments it has so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.tokenizer_utils import TokenizerWrapper

Part = tuple[str, str]  # ("text", s) | ("call", a piece of the open call's body) | ("end", "")
WHITESPACE = " \t\r\n"
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MORE = -1  # the text ends inside what is expected: it may still match


def json_calls(tokenizer: TokenizerWrapper) -> bool:
    """Whether the model writes its calls as {"name", "arguments"} JSON (mlx-lm's json_tools)."""
    parser = tokenizer.tool_parser
    return parser is not None and getattr(parser, "__module__", "").endswith(".json_tools")


class ToolCallText:
    """Splits streamed text at the model's call markers into plain text and the pieces of calls.
    Text that could still become a start marker is held back, so a call never leaks out as text.
    After a call, whitespace alone is held too: it goes out with the text that follows, and is
    dropped before the next call or at the end (the "\n" models put between calls is no answer).
    """

    def __init__(self, start: str, end: str) -> None:
        self.start, self.end = start, end
        self.held = ""  # text not yet known to be outside a call
        self.call: str | None = None  # the open call's body not yet given out (end marker watch)
        self.called = False  # a call has ended
        self.gap = ""  # whitespace since the last call's end

    @property
    def open(self) -> bool:
        return self.call is not None

    def feed(self, text: str) -> list[Part]:
        """The text's parts in order; a call's body comes out as it arrives, except a tail that
        could be the start of its end marker."""
        text, parts = self.held + text, []
        self.held = ""
        while text:
            if self.call is None:
                i = text.find(self.start)
                if i < 0:
                    keep = partial_suffix(text, self.start)
                    parts.append(("text", text[: len(text) - keep]))
                    self.held = text[len(text) - keep :]
                    break
                parts.append(("text", text[:i]))
                text, self.call = text[i + len(self.start) :], ""
            else:
                whole = self.call + text
                j = whole.find(self.end)
                if j < 0:
                    keep = partial_suffix(whole, self.end)
                    parts.append(("call", whole[: len(whole) - keep]))
                    self.call = whole[len(whole) - keep :]
                    break
                parts += [("call", whole[:j]), ("end", "")]
                text, self.call = whole[j + len(self.end) :], None
        return self._gaps([(kind, s) for kind, s in parts if s or kind == "end"])

    def flush(self) -> list[Part]:
        """At the end: held text is text after all; an open call keeps its last piece."""
        parts: list[Part] = [("text", self.held)] if self.held else []
        if self.call:
            parts.append(("call", self.call))
            self.call = ""
        self.held = ""
        parts = self._gaps(parts)
        self.gap = ""  # whitespace after the last call: dropped
        return parts

    def _gaps(self, parts: list[Part]) -> list[Part]:
        out: list[Part] = []
        for kind, s in parts:
            if kind == "text" and self.called:
                if not s.strip(WHITESPACE):
                    self.gap += s
                    continue
                s, self.gap = self.gap + s, ""
            elif kind == "call":
                self.gap = ""  # whitespace between two calls
            elif kind == "end":
                self.called = True
            out.append((kind, s))
        return out


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


@dataclass(frozen=True)
class Head:
    """How far a call body has got through `{"name": N, "arguments": `."""

    state: str  # "more": it may still get there; "no": it cannot; "args": it got there
    name: str = ""  # the name so far
    named: bool = False  # the name's closing quote was read
    args_at: int = 0  # "args": where the arguments' value begins


def _expect(text: str, i: int, literal: str) -> int | None:
    """After optional whitespace, `literal` at i: the index after it, MORE, or None."""
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    part = text[i : i + len(literal)]
    if part == literal:
        return i + len(literal)
    return MORE if literal.startswith(part) else None


def call_head(text: str) -> Head:
    """Reads the start of a JSON call body (name first, as forced calls and most models write)."""
    i: int | None = 0
    for literal in ("{", '"name"', ":", '"'):
        i = _expect(text, i or 0, literal)
        if i is None:
            return Head("no")
        if i == MORE:
            return Head("more")
    start = j = i or 0
    while j < len(text) and text[j] != '"':
        if text[j] not in NAME_CHARS:
            return Head("no")
        j += 1
    name = text[start:j]
    if j == len(text):
        return Head("more", name)
    i = j + 1
    for literal in (",", '"arguments"', ":"):
        i = _expect(text, i, literal)
        if i is None:
            return Head("no", name, True)
        if i == MORE:
            return Head("more", name, True)
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return Head("args", name, True, i) if i < len(text) else Head("more", name, True)


class ValueEnd:
    """Finds where one JSON object or array ends, fed its text in pieces."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = self.done = False

    def scan(self, text: str) -> int:
        """How many characters of `text` still belong to the value."""
        for k, c in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return k + 1
        return len(text)


class CallBody:
    """One call's body as it arrives. Announced (its name given out) once its head is read and
    its arguments open an object; from then on each piece yields the arguments' new text. A body
    in another shape (a model's own format, arguments as a string) waits for its end: `whole`.
    """

    def __init__(self, incremental: bool, names: tuple[str, ...], forced: bool) -> None:
        self.text = ""
        self.whole = not incremental
        self.names, self.forced = names, forced
        self.name: str | None = None  # once announced
        self.args_at = 0
        self.sent = 0  # characters of the arguments given out
        self.value = ValueEnd()

    def feed(self, piece: str) -> tuple[str | None, str]:
        """(the name when this piece announces the call, the arguments' new text)."""
        self.text += piece
        if self.whole:
            return None, ""
        announced = None
        if self.name is None:
            head = call_head(self.text)
            if head.state == "no" or (head.state == "args" and self.text[head.args_at] != "{"):
                self.whole = True
            if head.state != "args" or self.whole:
                return None, ""
            self.name = announced = head.name
            self.args_at = head.args_at
        return announced, self._more_arguments()

    def _more_arguments(self) -> str:
        if self.value.done:
            return ""
        new = self.text[self.args_at + self.sent :]
        n = self.value.scan(new)
        self.sent += n
        return new[:n]

    def cut(self) -> tuple[str, str] | None:
        """At a cut (max_tokens) before the call was announced: (name, arguments so far) when
        the text settles which tool it calls, else None. A forced call's name is settled as
        soon as one allowed name fits what was written (the grammar allows only those)."""
        head = call_head(self.text)
        if head.state == "no":
            return None
        if head.named:
            name = head.name if head.name in self.names else None
        else:
            fits = [n for n in self.names if n.startswith(head.name)] if self.forced else []
            name = fits[0] if len(fits) == 1 else None
        if name is None:
            return None
        arguments = self.text[head.args_at :] if head.state == "args" else ""
        return name, arguments
