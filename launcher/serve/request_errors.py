"""A request body checked against its declared model, and pydantic's first error turned into the
ApiError (400) its route answers with. The message names the field by pydantic's location
(`'messages[1].content[0].type' is 'image_url': …`); `param`, which OpenAI's error object
carries, is that location unless the API's own table (`PARAMS` in openai_models.py and
anthropic_models.py) names it otherwise, as the API always has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from pydantic_core.core_schema import ErrorType

from launcher.serve.request_api import ApiError, bad
from launcher.serve.request_models import PATTERN_WORDS

M = TypeVar("M", bound=BaseModel)
BUILT_IN = frozenset(get_args(ErrorType))  # pydantic's own error types; the rest are ours
# pydantic's errors in the API's words (its own messages say "Input should be…").
WORDS = {
    "missing": "is required",
    "string_type": "must be a string",
    "string_too_short": "must be a non-empty string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "must be {expected}",
}


class Name(NamedTuple):
    """How an API names the errors at one location: its `param` (each `[]` filled with the
    location's indices in turn) and, where the general words would say too little, its own."""

    param: str
    words: str | None = None


Names = Mapping[str, Name]  # location pattern (`[]` any index, `*` any key) -> its name


def validated(model: type[M], body: bytes, names: Names) -> M:
    """The body as `model` declares it (pydantic parses the JSON itself: one pass, in Rust);
    ApiError naming the first bad field otherwise."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise api_error(e.errors(include_url=False, include_input=False)[0], names) from None


def api_error(error: ErrorDetails, names: Names) -> ApiError:
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    loc = [part for part in error["loc"] if not _is_tag(part)] + list(ctx.pop("at", ()))
    if not loc:
        return bad(_body_words(error, ctx))
    where = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" if i else str(part)
        for i, part in enumerate(loc)
    )
    name = _name(loc, names)
    if name is None:
        return bad(f"'{where}' {_words(error, ctx)}", where)
    indices = iter(part for part in loc if isinstance(part, int))
    param = re.sub(r"\[\]", lambda _: f"[{next(indices)}]", name.param)
    return bad(f"'{where}' {name.words or _words(error, ctx)}", param)


def _is_tag(part: Any) -> bool:
    """A union's tag (request_models.py writes them `<…>`) or a map key's marker: not a field."""
    return isinstance(part, str) and (part == "[key]" or (part[:1] == "<" and part[-1:] == ">"))


def _name(loc: list[Any], names: Names) -> Name | None:
    parts = ["[]" if isinstance(part, int) else str(part) for part in loc]
    for pattern, name in names.items():
        wanted = re.findall(r"\[\]|[^.\[\]]+", pattern)
        if len(wanted) == len(parts) and all(
            w in ("*", p) for w, p in zip(wanted, parts, strict=True)
        ):
            return name
    return None


def _words(error: ErrorDetails, ctx: dict[str, Any]) -> str:
    kind = error["type"]
    if kind not in BUILT_IN:
        return error["msg"]  # ours: worded where raised
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "must be a non-empty list"
    if kind == "string_pattern_mismatch":
        return PATTERN_WORDS.get(ctx["pattern"], f"must match {ctx['pattern']}")
    words = WORDS.get(kind)
    if words is None:
        return f"is not valid ({error['msg']})"
    shown = {k: f"{v:g}" if isinstance(v, float) else v for k, v in ctx.items()}
    return words.format(**shown)


def _body_words(error: ErrorDetails, ctx: dict[str, Any]) -> str:
    if error["type"] == "json_invalid":  # jiter's reason and where: "… at line 1 column 9"
        reason = str(ctx.get("error", error["msg"]))
        if "recursion limit" in reason:  # jiter stops at 200 levels, before any work
            return f"the request body is nested too deeply ({reason})"
        return f"the request body is not valid JSON: {reason}"
    if error["type"] == "model_type":
        return "the request body must be a JSON object"
    return f"the request body {_words(error, ctx)}"
