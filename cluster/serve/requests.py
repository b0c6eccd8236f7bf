"""Rank 0's view of one request: its line from the launcher, its prompt tokens, its output.

Requests arrive as JSON lines on rank 0's stdin (launcher/serve/openai_api.py writes them);
`{"cancel": id}` withdraws one. Output leaves as `begin` / `delta` / `done` / `request_error`
events tagged with the request's id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper


class RequestError(Exception):
    """A request rank 0 cannot run (bad prompt): reported for that request, nothing broadcast."""

    def __init__(self, message: str, request_id: str = "") -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    id: str
    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]


@dataclass(frozen=True)
class Cancel:
    id: str


def prompt_ids(request: dict[str, Any], tokenizer: TokenizerWrapper) -> list[int]:
    """Chat messages through the model's chat template; a raw prompt as mlx-lm encodes it."""
    if request.get("messages") is not None:
        if not tokenizer.has_chat_template:
            raise RequestError("this model has no chat template: use /v1/completions")
        try:
            ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True)
        except Exception as e:  # a template may reject roles or orderings
            raise RequestError(f"the chat template rejected the messages: {e}") from None
        return [int(i) for i in ids]
    if request.get("prompt_ids") is not None:
        ids = [int(i) for i in request["prompt_ids"]]
        vocab = len(tokenizer.get_vocab())
        if any(not 0 <= i < vocab for i in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        return ids
    prompt = str(request.get("prompt", ""))
    # As stream_generate encodes a string: special tokens unless it already starts with BOS.
    bos = tokenizer.bos_token
    return list(
        tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    )


def parse_line(line: str, tokenizer: TokenizerWrapper) -> Request | Cancel:
    """One stdin line → a request or a cancel; RequestError (with the id when known) if bad."""
    request_id = ""
    try:
        raw = json.loads(line)
        if "cancel" in raw:
            return Cancel(str(raw["cancel"]))
        request_id = str(raw["id"])
        ids = prompt_ids(raw, tokenizer)
        if not ids:
            raise RequestError("the prompt is empty after tokenization")
        return Request(
            id=request_id,
            ids=ids,
            max_tokens=int(raw["max_tokens"]),
            temperature=float(raw["temperature"]),
            top_p=float(raw["top_p"]),
            seed=int(raw["seed"]),
            stop=[str(s) for s in raw.get("stop") or []],
        )
    except RequestError as e:
        raise RequestError(str(e), request_id) from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RequestError(f"bad request line: {e}", request_id) from None


class StopScanner:
    """Cuts the text before the first stop string, and holds back a tail that could still
    grow into one, so streamed text never shows part of a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""  # text not sent yet: it may be the start of a stop string

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string ended the text)."""
        text = self.pending + piece
        hits = [i for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            self.pending = ""
            return text[: min(hits)], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self.pending = text[len(text) - hold :]
        return text[: len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class Output:
    """What rank 0 tracks of a request while it is in the batch."""

    request: Request
    cached: int  # prompt tokens taken from the prefix cache
    detokenizer: Any
    scanner: StopScanner
    tokens: list[int] = field(default_factory=list)  # completion token ids so far
    finished: bool = False  # done was sent (a stop string ends it before the batch does)
