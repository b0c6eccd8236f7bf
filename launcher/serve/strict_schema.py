"""OpenAI's strict mode for a JSON schema (`tools[].function.strict`, `response_format`'s
`json_schema.strict`; Anthropic's `tools[].strict`): every object allows no property outside
its `properties`, and lists every one of them in `required`, at every depth.

A strict schema that breaks the second rule is refused (400 naming the object and the property
left out), as OpenAI refuses it: leaving a property out of `required` says it is optional, and
strict mode's way to say that is a required property whose type allows null — making it required
silently would change what the client asked for. An object without `additionalProperties` gets
`false` (the one meaning strict mode allows); any other value is refused.
"""

from __future__ import annotations

from typing import Any

from launcher.serve.request_api import bad

MAPS = ("properties", "$defs", "definitions")  # keys whose values are named subschemas
LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")  # keys whose values are lists of them
ONES = ("items", "not", "if", "then", "else", "contains")  # keys whose value is one


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or ("properties" in schema)
    )


def _object(schema: dict[str, Any], at: str) -> dict[str, Any]:
    """One object schema checked and closed."""
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise bad(f"{at}.properties must be an object", f"{at}.properties")
    extra = schema.get("additionalProperties", False)
    if extra is not False:
        raise bad(
            f"{at}.additionalProperties must be false with strict: true "
            "(strict mode allows no property outside the schema)",
            f"{at}.additionalProperties",
        )
    required = schema.get("required", [])
    if not isinstance(required, list):
        raise bad(f"{at}.required must be a list of property names", f"{at}.required")
    missing = [name for name in properties if name not in required]
    if missing:
        raise bad(
            f"{at}.required must list every property with strict: true; {missing[0]!r} is "
            "missing (strict mode's optional field is a required one whose type allows null)",
            f"{at}.required",
        )
    return {**schema, "additionalProperties": False}


def strict_schema(schema: Any, at: str) -> Any:
    """`schema` as strict mode constrains it; ApiError (400) naming what strict mode refuses."""
    if not isinstance(schema, dict):
        return schema  # true / false schemas, and values of keywords that hold no schema
    out = _object(schema, at) if _is_object(schema) else dict(schema)
    for key in MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {k: strict_schema(v, f"{at}.{key}.{k}") for k, v in schema[key].items()}
    for key in LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [strict_schema(v, f"{at}.{key}[{i}]") for i, v in enumerate(schema[key])]
    for key in ONES:
        if key in schema:
            out[key] = strict_schema(schema[key], f"{at}.{key}")
    return out
