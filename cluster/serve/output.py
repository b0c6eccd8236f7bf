"""Rank 0's output for one choice of a request: text through the stop strings, the model's
tool calls read out of it (tool_stream.py), and logprobs — as `delta`, `tool_call` and `done`
events. A call is one `tool_call` event with `call` {id, name, arguments}, then `tool_call`
events with only `arguments`: the text its arguments grew by."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper

from cluster.serve.requests import Request, StopScanner
from cluster.serve.tool_stream import CallBody, Part, ToolCallText, call_head, json_calls
from cluster.speculative.drafts import DraftCounts

Emit = Callable[..., None]


def _token_entry(tokenizer: TokenizerWrapper, token: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


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
        self.tool_text: ToolCallText | None = None
        start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
        if request.tool_mode != "none" and start and end:
            self.tool_text = ToolCallText(start, end)
        self.forced = request.tool_mode == "forced"
        # Calls in JSON stream their arguments; a model's own format is parsed when it ends.
        self.incremental = self.forced or json_calls(tokenizer)
        self.body: CallBody | None = None  # the call being read

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
        parts: list[Part]
        if self.forced and self.tool_text is None:
            parts = [("call", piece)]  # no markers: the whole output is one call
        elif self.tool_text is not None:
            parts = self.tool_text.feed(piece) + (self.tool_text.flush() if final else [])
        else:
            parts = [("text", piece)]
        text = ""
        for kind, s in parts:
            if kind == "text" and not self.forced:  # forced: only separators between calls
                text += s
            elif kind != "text":
                text = self._send(text)
                if kind == "call":
                    self._piece(s)
                else:
                    self._end_call(cut=False)
        if final and self.body is not None:
            text = self._send(text)
            self._end_call(cut=True)
        if final and self.forced and not self.calls and len(self.request.forced_names) == 1:
            self._announce(self.request.forced_names[0], "")  # cut before its marker: named
        if text or (final and self.logprobs):
            self._send(text, force=True)

    def _send(self, text: str, force: bool = False) -> str:
        """Text before a call goes out before it (Anthropic's blocks keep that order)."""
        if text or force:
            self.emit("delta", id=self.request.id, index=self.index, text=text, **self._lp())
        return ""

    def _piece(self, piece: str) -> None:
        if self.body is None:
            names = tuple(t["function"]["name"] for t in self.request.tools or [])
            self.body = CallBody(self.incremental, self.request.forced_names or names, self.forced)
        name, arguments = self.body.feed(piece)
        if name is not None:
            self._announce(name, arguments)
        elif arguments:
            self.emit("tool_call", id=self.request.id, index=self.index, arguments=arguments)

    def _announce(self, name: str, arguments: str) -> None:
        call = {"id": "call_" + uuid.uuid4().hex[:24], "name": name, "arguments": arguments}
        self.emit("tool_call", id=self.request.id, index=self.index, call=call)
        self.calls += 1

    def _end_call(self, cut: bool) -> None:
        """A call's end marker, or the end of the output with a call open. A call already
        announced is done; a whole one is parsed now. A call cut by max_tokens stays a call when
        its name is settled and is dropped (never given out as raw text) when it is not; a cut
        body that never looked like a JSON call goes back as text, as before."""
        body, self.body = self.body, None
        if body is None or body.name is not None:
            return
        if not cut:
            self._call(body.text)
            return
        settled = self._parse(body.text) or body.cut()  # whole but for its end marker, or cut
        if settled is not None:
            self._announce(*settled)
        elif not self.forced and call_head(body.text).state == "no":
            start = self.tokenizer.tool_call_start or ""
            self.emit("delta", id=self.request.id, index=self.index, text=start + body.text)

    def _lp(self) -> dict[str, Any]:
        if self.request.logprobs is None:
            return {}
        sent, self.logprobs = self.logprobs, []
        return {"logprobs": sent}

    def _parse(self, body: str) -> tuple[str, str] | None:
        """(name, arguments) of a whole call's text (the model's own parser in auto mode)."""
        try:
            if self.request.tool_mode == "auto" and self.tokenizer.tool_parser is not None:
                parsed = self.tokenizer.tool_parser(body, self.request.tools)
            else:
                parsed = json.loads(body)
            name, arguments = str(parsed["name"]), parsed.get("arguments", {})
        except Exception:  # not a call after all (a random model may open one and ramble)
            return None
        return name, arguments if isinstance(arguments, str) else json.dumps(arguments)

    def _call(self, body: str) -> None:
        """One whole call's text → a tool_call event, or text when it is not a call."""
        call = self._parse(body)
        if call is None:
            self.emit("delta", id=self.request.id, index=self.index, text=body)
        else:
            self._announce(*call)

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
