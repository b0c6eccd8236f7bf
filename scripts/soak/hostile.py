"""A trickle of hostile bodies, the kinds serve's tests already refuse: malformed JSON, wrong
types, out-of-range fields, a seed past int64, a prompt far past the context, a body nested to
the bottom, refused features, schemas llguidance cannot enforce. Each must get a 4xx, never a
5xx, and the server must stay up."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

CHAT, COMPLETIONS, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/messages"
USER = [{"role": "user", "content": "Hello world"}]


def _j(body: object) -> bytes:
    return json.dumps(body).encode()


def _chat(**fields: object) -> bytes:
    return _j({"model": "m", "messages": USER, "max_tokens": 4, **fields})


def _completion(**fields: object) -> bytes:
    return _j({"model": "m", "prompt": "Hello", "max_tokens": 4, **fields})


UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
LOOSE = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True}
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
STRICT_LOOSE = {"name": "x", "schema": LOOSE, "strict": True}  # strict forbids extra keys
IMAGE = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}
BODIES: list[tuple[str, bytes]] = [
    (CHAT, b"not json"),
    (CHAT, b"[1, 2]"),
    (CHAT, b"{}"),
    (CHAT, _j({"messages": [{"role": "wizard", "content": "x"}]})),
    (CHAT, _j({"messages": [{"role": "user", "content": 5}]})),
    (CHAT, _chat(n=9)),
    (CHAT, _chat(top_logprobs=21, logprobs=True)),
    (CHAT, _chat(logit_bias={"999999": 5})),
    (CHAT, _chat(functions=[{"name": "f"}])),
    (CHAT, _j({"model": "m", "messages": [{"role": "user", "content": [IMAGE]}]})),
    (CHAT, _chat(response_format={"type": "json_schema", "json_schema": {"schema": UNIQUE}})),
    (CHAT, _chat(response_format={"type": "json_schema", "json_schema": STRICT_LOOSE})),
    (CHAT, _chat(tool_choice={"type": "function", "function": {"name": "nope"}})),
    (COMPLETIONS, _completion(temperature="hot")),
    (COMPLETIONS, _completion(max_tokens=0)),
    (COMPLETIONS, _completion(stop=["a", "b", "c", "d", "e"])),
    (COMPLETIONS, _completion(n=2)),
    (COMPLETIONS, _completion(prompt=["a", "b"])),
    (COMPLETIONS, _j({"max_tokens": 3})),
    (COMPLETIONS, _completion(stream="yes")),
    (COMPLETIONS, _completion(seed=2**64, temperature=1)),
    (COMPLETIONS, _completion(prompt="the cluster " * 25_000)),  # ~300 KB, far past the context
    (COMPLETIONS, _completion(max_tokens=1 << 20)),
    (COMPLETIONS, b"[" * 100_000),
    (MESSAGES, _j({"model": "m", "messages": USER})),  # no max_tokens
    (
        MESSAGES,
        _j({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [PNG]}]}),
    ),
    (MESSAGES, _j({"model": "m", "max_tokens": 4, "messages": USER, "temperature": 3})),
]


def post(root: str, path: str, body: bytes, timeout_s: float) -> int:
    """The HTTP status of one POST; 0 when nothing answered (counted as a failure)."""
    headers = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    request = urllib.request.Request(root + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, urllib.error.URLError):
        return 0
