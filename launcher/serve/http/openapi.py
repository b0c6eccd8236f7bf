"""GET /openapi.json: the generate routes' request bodies as their models declare them
(openai_models.py, anthropic_models.py) and each API's error object, as OpenAPI 3.1, whose
schemas are JSON Schema 2020-12, the dialect pydantic writes. Made once, from the same
declarations that check every body, so it cannot drift from what the server takes.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from launcher.serve.anthropic_models import CountTokensBody, MessagesBody
from launcher.serve.openai_models import ChatBody, CompletionBody

VERSION = "3.1.0"
REF = "#/components/schemas/{model}"


class OpenAIErrorObject(BaseModel):
    message: str
    type: str
    param: str | None  # the bad field's location, as `messages[0].content[1].type`
    code: str | None


class OpenAIError(BaseModel):
    """OpenAI's error object, on the OpenAI routes."""

    error: OpenAIErrorObject


class AnthropicErrorObject(BaseModel):
    type: str  # invalid_request_error (400), authentication_error (401), …
    message: str  # names the bad field's location


class AnthropicError(BaseModel):
    """Anthropic's error object, under /v1/messages."""

    type: Literal["error"]
    error: AnthropicErrorObject


# path -> (what it answers, its body, its errors)
ROUTES: dict[str, tuple[str, type[BaseModel], type[BaseModel]]] = {
    "/v1/chat/completions": ("OpenAI chat completion", ChatBody, OpenAIError),
    "/v1/completions": ("OpenAI completion of one prompt", CompletionBody, OpenAIError),
    "/v1/messages": ("Anthropic message", MessagesBody, AnthropicError),
    "/v1/messages/count_tokens": ("Anthropic token count", CountTokensBody, AnthropicError),
}
KEYS = {  # with --api-key, either header carries it
    "bearer": {"type": "http", "scheme": "bearer"},
    "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}


def openapi_json(keyed: bool) -> bytes:
    """The document; `keyed`: serve runs with --api-key, so the routes need it."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((body, "validation") for _, body, _ in ROUTES.values()),
        *((error, "serialization") for error in (OpenAIError, AnthropicError)),
    ]
    refs, schemas = models_json_schema(models, ref_template=REF)
    paths: dict[str, Any] = {}
    for path, (summary, body, error) in ROUTES.items():
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": path.removeprefix("/v1/").replace("/", "_"),
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": refs[body, "validation"]}},
            },
            "responses": {
                "200": {"description": "the answer, whole or as server-sent events (`stream`)"},
                "default": {
                    "description": "an error: 400 names the bad field",
                    "content": {"application/json": {"schema": refs[error, "serialization"]}},
                },
            },
        }
        if keyed:
            operation["security"] = [{name: []} for name in KEYS]
        paths[path] = {"post": operation}
    # Only what a route refers to (a union's branch left out of the schema still has its own).
    text = json.dumps(paths) + json.dumps(schemas)
    used = {
        name: schema for name, schema in schemas["$defs"].items() if REF.format(model=name) in text
    }
    document = {
        "openapi": VERSION,
        "info": {"title": "mlx-cluster serve", "version": _version()},
        "paths": paths,
        "components": {"schemas": used, "securitySchemes": KEYS},
    }
    return json.dumps(document).encode()


def _version() -> str:
    try:
        return version("mlx-cluster")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
