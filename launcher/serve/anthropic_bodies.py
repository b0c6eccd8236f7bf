"""Anthropic's answers on `mlx-cluster serve`, built from rank 0's events: the message of a
non-streamed /v1/messages request, its event stream, and /v1/messages/count_tokens' count.

The stream is Anthropic's sequence: message_start, ping, then per content block (text, or one
tool_use per tool call) content_block_start / content_block_delta (text_delta or
input_json_delta) / content_block_stop, then message_delta (stop_reason, usage) and
message_stop. A tool_use block's input streams as it is generated; a call cut by max_tokens stays
a tool_use block (stop_reason max_tokens). Usage follows Anthropic's meaning: input_tokens
excludes the prompt tokens read from the prefix cache, which are cache_read_input_tokens.
"""

from __future__ import annotations

from typing import Any

from launcher.serve.openai_bodies import Event, count, progress_comment, sse
from launcher.serve.partial_json import partial_object
from launcher.serve.request_api import GenerateRequest

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicAnswer:
    """One /v1/messages answer (always one choice), fed rank 0's events in order."""

    def __init__(self, generate: GenerateRequest, request_id: str, model: str) -> None:
        self.id, self.model = request_id, model
        self.text = ""
        self.calls: list[dict[str, Any]] = []  # tool_use blocks without their input
        self.arguments: list[str] = []  # each call's JSON arguments as generated
        self.blocks = 0  # content blocks started so far (the stream's block index)
        self.open_block: str | None = None  # the kind of the block being streamed
        self.started = self.finished = False
        self.prompt_tokens = self.cached_tokens = self.output_tokens = 0
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    def _usage(self) -> dict[str, Any]:
        return {
            "input_tokens": max(0, self.prompt_tokens - self.cached_tokens),
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cached_tokens,
            "cache_creation_input_tokens": 0,
        }

    def opening(self) -> list[bytes]:
        return []  # message_start waits for `begin`: it carries the prompt's token counts

    def feed(self, event: Event) -> list[bytes]:
        """Take one event; the SSE events it makes (used only when streaming)."""
        name, frames = event.get("event"), []
        if name == "begin":
            self.prompt_tokens = count(event, "prompt_tokens")
            self.cached_tokens = count(event, "cached_tokens")
        if not self.started and name != "prompt_progress":
            self.started = True
            frames += self._start()
        if name == "prompt_progress":
            frames.append(progress_comment(event))
        elif name == "delta" and (text := str(event.get("text") or "")):
            self.text += text
            frames += self._open("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": text}
            frames.append(self._event("content_block_delta", index=self.blocks - 1, delta=delta))
        elif name == "tool_call":
            frames += self._tool_call(event)
        elif name == "done" and not self.finished:
            frames += self._end(event)
        return frames

    def _tool_call(self, event: Event) -> list[bytes]:
        """A tool_use block opens when its call starts; its arguments follow as
        input_json_delta as they grow (the block stays open until the next one or the end)."""
        frames, call = [], event.get("call")
        if call is not None:
            block = {"type": "tool_use", "id": str(call.get("id", "")), "name": str(call["name"])}
            self.calls.append(block)
            self.arguments.append("")
            frames += self._open("tool_use", {**block, "input": {}})
            more = str(call.get("arguments") or "")
        else:
            more = str(event.get("arguments") or "")
        if more and self.calls and self.open_block == "tool_use":
            self.arguments[-1] += more
            delta = {"type": "input_json_delta", "partial_json": more}
            frames.append(self._event("content_block_delta", index=self.blocks - 1, delta=delta))
        return frames

    def _event(self, name: str, **body: Any) -> bytes:
        return sse({"type": name, **body}, name)

    def _start(self) -> list[bytes]:
        message = {**self._message([]), "usage": self._usage()}
        return [self._event("message_start", message=message), self._event("ping")]

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        """Start a content block unless one of this kind is open (text keeps its block)."""
        if self.open_block == kind == "text":
            return []
        frames = self._close()
        self.open_block = kind
        self.blocks += 1
        start = self._event("content_block_start", index=self.blocks - 1, content_block=block)
        frames.append(start)
        return frames

    def _close(self) -> list[bytes]:
        if self.open_block is None:
            return []
        self.open_block = None
        return [self._event("content_block_stop", index=self.blocks - 1)]

    def _end(self, event: Event) -> list[bytes]:
        self.finished = True
        self.output_tokens = count(event, "completion_tokens")
        self.prompt_tokens = count(event, "prompt_tokens") or self.prompt_tokens
        self.cached_tokens = count(event, "cached_tokens") or self.cached_tokens
        finish = str(event.get("finish_reason") or "stop")
        sequence = event.get("stop_sequence")
        if isinstance(sequence, str) and sequence and finish == "stop":
            self.stop_reason, self.stop_sequence = "stop_sequence", sequence
        elif self.calls and finish in ("stop", "tool_calls"):
            self.stop_reason = "tool_use"
        else:  # a call cut by max_tokens is still a tool_use block, under max_tokens
            self.stop_reason = STOP_REASONS.get(finish, "end_turn")
        frames = [] if self.blocks else self._open("text", {"type": "text", "text": ""})
        frames += self._close()
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        frames.append(self._event("message_delta", delta=delta, usage=self._usage()))
        frames.append(self._event("message_stop"))
        return frames

    def closing(self) -> list[bytes]:
        return []  # message_stop has ended the stream

    def failure(self, error: dict[str, Any]) -> list[bytes]:
        return [sse(error, "error")]

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
        }

    def body(self) -> dict[str, Any]:
        """The whole message: its text block (even an empty one when there is nothing else),
        then one tool_use block per call; a cut call's input is the object its arguments were
        becoming (partial_json.py)."""
        text = [{"type": "text", "text": self.text}] if self.text or not self.calls else []
        uses = [
            {**block, "input": partial_object(arguments)}
            for block, arguments in zip(self.calls, self.arguments, strict=True)
        ]
        return {**self._message(text + uses), "usage": self._usage()}


class CountAnswer:
    """/v1/messages/count_tokens: rank 0 reads the prompt and answers `done` with its length."""

    def __init__(self, generate: GenerateRequest, request_id: str, model: str) -> None:
        self.input_tokens = 0
        self.finished = False

    def opening(self) -> list[bytes]:
        return []

    def feed(self, event: Event) -> list[bytes]:
        if event.get("event") == "done":
            self.input_tokens, self.finished = count(event, "prompt_tokens"), True
        return []

    def closing(self) -> list[bytes]:
        return []

    def failure(self, error: dict[str, Any]) -> list[bytes]:
        return []

    def body(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens}
