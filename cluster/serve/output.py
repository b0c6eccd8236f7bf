"""Rank 0's output for one choice of a request: text through the stop strings, the model's
tool calls parsed out of it, and logprobs — as `delta`, `tool_call` and `done` events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.requests import Request, StopScanner
from cluster.speculative.drafts import DraftCounts

Emit = Callable[..., None]


def _token_entry(tokenizer: TokenizerWrapper, token: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


class ToolCallText:
    """Splits streamed text into plain text and complete calls between the model's markers.
    Text that could still become a start marker is held back, so a call never leaks out as text.
    """

    def __init__(self, start: str, end: str) -> None:
        self.start, self.end = start, end
        self.held = ""  # text not yet known to be outside a call
        self.call: str | None = None  # the call being read, once its start marker was seen

    def feed(self, text: str) -> tuple[str, list[str]]:
        """(plain text to send, the bodies of the calls that ended)."""
        text, plain, calls = self.held + text, "", []
        self.held = ""
        while text:
            if self.call is None:
                i = text.find(self.start)
                if i < 0:
                    keep = _partial_suffix(text, self.start)
                    plain += text[: len(text) - keep]
                    self.held = text[len(text) - keep :]
                    break
                plain, text, self.call = plain + text[:i], text[i + len(self.start) :], ""
            else:
                j = (self.call + text).find(self.end)
                if j < 0:
                    self.call += text
                    break
                whole = self.call + text
                calls.append(whole[:j])
                text, self.call = whole[j + len(self.end) :], None
        return plain, calls

    def flush(self) -> str:
        """At the end: what was held back, and an unfinished call, are text after all."""
        out = self.held + ("" if self.call is None else self.start + self.call)
        self.held, self.call = "", None
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ChoiceOutput:
    def __init__(
        self,
        request: Request,
        index: int,
        cached: int,
        tokenizer: TokenizerWrapper,
        emit: Emit,
        drafts: Callable[[], DraftCounts | None] | None = None,
    ) -> None:
        self.request, self.index, self.cached = request, index, cached
        self.drafts = drafts
        self.tokenizer, self.emit = tokenizer, emit
        self.detokenizer = tokenizer.detokenizer
        self.scanner = StopScanner(request.stop)
        self.tokens: list[int] = []
        self.logprobs: list[dict[str, Any]] = []  # entries not yet sent with a delta
        self.calls = 0
        self.forced_text = ""  # a forced call without markers: the whole output is the call
        self.tool_text: ToolCallText | None = None
        start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
        if request.tool_mode != "none" and start and end:
            self.tool_text = ToolCallText(start, end)

    def token(self, token: int, finish: str | None, logprobs: mx.array) -> bool:
        """One generated token (finish: the batch's reason when it is the last); returns
        whether a stop string ended the choice here."""
        if finish != "stop":  # a "stop" step carries the end-of-turn token: not text
            self.tokens.append(token)
            self.detokenizer.add_token(token)
            if self.request.logprobs is not None:
                self.logprobs.append(self._logprob(token, logprobs))
        if finish is not None:
            self.detokenizer.finalize()
        piece, stopped = self.scanner.feed(self.detokenizer.last_segment)
        if stopped or finish is not None:
            piece += "" if stopped else self.scanner.flush()
        self._text(piece, final=stopped or finish is not None)
        if stopped or finish is not None:
            self._done("stop" if stopped else str(finish))
        return stopped

    def _logprob(self, token: int, logprobs: mx.array) -> dict[str, Any]:
        k = self.request.logprobs or 0
        values = np.asarray(logprobs.astype(mx.float32))
        top: list[dict[str, Any]] = []
        if k > 0:
            ids = np.argpartition(-values, k - 1)[:k]
            ids = ids[np.argsort(-values[ids], kind="stable")]  # most likely first
            top = [_token_entry(self.tokenizer, int(i), float(values[i])) for i in ids]
        return {**_token_entry(self.tokenizer, token, float(values[token])), "top_logprobs": top}

    def _text(self, piece: str, final: bool) -> None:
        calls: list[str] = []
        if self.request.tool_mode == "forced" and self.tool_text is None:
            self.forced_text += piece  # bare JSON: parsed whole at the end
            piece = ""
            if final:
                calls = [self.forced_text]
        elif self.tool_text is not None:
            piece, calls = self.tool_text.feed(piece)
            if final:
                piece += self.tool_text.flush()
            if self.request.tool_mode == "forced":
                piece = ""  # the grammar allows only separators between forced calls
        if piece or (final and self.logprobs):
            self.emit("delta", id=self.request.id, index=self.index, text=piece, **self._lp())
        for body in calls:
            self._call(body)

    def _lp(self) -> dict[str, Any]:
        if self.request.logprobs is None:
            return {}
        sent, self.logprobs = self.logprobs, []
        return {"logprobs": sent}

    def _call(self, body: str) -> None:
        """One call's text → a tool_call event (the model's own parser in auto mode)."""
        try:
            if self.request.tool_mode == "auto" and self.tokenizer.tool_parser is not None:
                parsed = self.tokenizer.tool_parser(body, self.request.tools)
            else:
                parsed = json.loads(body)
            name, arguments = str(parsed["name"]), parsed.get("arguments", {})
        except Exception:  # not a call after all (a random model may open one and ramble)
            self.emit("delta", id=self.request.id, index=self.index, text=body)
            return
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call = {"id": "call_" + uuid.uuid4().hex[:24], "name": name, "arguments": arguments}
        self.emit("tool_call", id=self.request.id, index=self.index, call=call)
        self.calls += 1

    def _done(self, finish: str) -> None:
        if self.calls and finish == "stop":
            finish = "tool_calls"
        self.emit(
            "done",
            id=self.request.id,
            index=self.index,
            finish_reason=finish,
            prompt_tokens=len(self.request.ids),
            completion_tokens=len(self.tokens),
            cached_tokens=self.cached,
            token_ids=self.tokens,
            **({"stop_sequence": self.scanner.matched} if self.scanner.matched else {}),
            **self._draft_fields(),
        )

    def _draft_fields(self) -> dict[str, int]:
        """What this choice drafted, when it drafted or the client predicted its output."""
        counts = self.drafts() if self.drafts is not None else None
        if counts is None or not (counts.drafted or self.request.prediction):
            return {}
        return {
            "drafted_tokens": counts.drafted,
            "accepted_tokens": counts.accepted,
            "draft_checks": counts.checks,
            "accepted_prediction_tokens": counts.prediction_accepted,
            "rejected_prediction_tokens": counts.prediction_rejected,
        }
