"""What the OpenAI and Anthropic request models share (openai_models.py, anthropic_models.py):
the base of every body and part, and the field types both declare theirs with.

Bodies take JSON's own types only — no "5" for 5, no 1 for true, no NaN or infinity — and ignore
fields they do not know; in a whole body a field given as null is one left out (OpenAI's SDKs
send unset options so). A union is told apart by one look at the value (a `Discriminator`), so
a bad value is one error that says what was expected, not one per branch; the tags, written
`<…>`, are no part of the location an error names (request_errors.py drops them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from launcher.serve.request_api import MAX_INT

T = TypeVar("T")
STRING, LIST, OBJECT, OTHER = "<string>", "<list>", "<object>", "<other>"  # union tags
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's and Anthropic's rule for tool names
TOKEN_ID_PATTERN = r"^[0-9]+$"  # logit_bias's keys: token ids written as strings
PATTERN_WORDS = {
    NAME_PATTERN: "must be 1 to 64 letters, digits, '_' or '-'",
    TOKEN_ID_PATTERN: "must be a token id (digits)",
}
NOT_SERVED = "is not supported by mlx-cluster serve (leave it out)"


class Part(BaseModel):
    """A part of a request body (a message, a content part, a tool, ...)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class Body(Part):
    """A whole request body."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            return {key: value for key, value in raw.items() if value is not None}
        return raw


def json_kind(value: Any) -> str | None:
    """A value's JSON type as a union's tag: STRING, LIST or OBJECT (anything else: no branch)."""
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return LIST
    return OBJECT if isinstance(value, dict) else None


def tagged_by(
    key: str, tags: Mapping[str, str], other: str | None = None
) -> Callable[[Any], str | None]:
    """A union's tag from an object's `key` ("type", "role"): tags[value]; any other value goes
    to the branch `other` (one whose error names the values allowed) or, without one, is the
    union's own error, as is a value that is no object."""

    def tag(value: Any) -> str | None:
        if not isinstance(value, dict):
            return None
        kind = value.get(key)
        return tags.get(kind, other) if isinstance(kind, str) else other

    return tag


def refusing(refused: Mapping[str, str]) -> BeforeValidator:
    """A part's `type` naming what serve does not take (images, audio, files): a 400 that says
    so; any other kind is left to the field's own check."""

    def check(kind: Any) -> Any:
        if isinstance(kind, str) and kind in refused:
            raise PydanticCustomError(
                "not_served",
                "is {kind}: mlx-cluster serve takes text only (no {what})",
                {"kind": repr(kind), "what": refused[kind]},
            )
        return kind

    return BeforeValidator(check)


def needs(field: str, other: str, words: str) -> Any:
    """A validator for a model: `field` is taken only when `other`, declared before it, is
    true (stream_options needs stream)."""

    def check(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
        if not info.data.get(other):
            raise PydanticCustomError("needs", words)
        return value

    return field_validator(field)(check)


def named_once(*path: str) -> AfterValidator:
    """Tools whose names (at `path` in each) all differ: a call names the tool it calls."""

    def check(tools: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for i, tool in enumerate(tools):
            name = tool
            for attribute in path:
                name = getattr(name, attribute)
            if name in seen:  # "at": where below the list the error is (request_errors.py)
                raise PydanticCustomError(
                    "duplicate", "{name} is given twice", {"name": repr(name), "at": (i, *path)}
                )
            seen.add(name)
        return tools

    return AfterValidator(check)


@dataclass(frozen=True)
class Only:
    """A field served at one value only, its neutral one: any other would change the answer
    unannounced, so it is a 400 saying so. null is always taken (the same as leaving it out)."""

    value: Any
    words: str = NOT_SERVED

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"const": self.value}

    def _check(self, value: Any) -> Any:
        if value is not None and value != self.value:
            raise PydanticCustomError("not_served", self.words)
        return value


class OneOrList:
    """A list of strings whose one string may also come alone, as stop strings may; the schema
    says both forms."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self._listed, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        listed = handler(schema)
        return {"anyOf": [listed["items"], listed]}

    @staticmethod
    def _listed(value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise PydanticCustomError("strings", "must be a string or a list of strings")
        return value


NonEmpty = Annotated[str, Field(min_length=1)]
ToolName = Annotated[str, Field(pattern=NAME_PATTERN)]
JsonObject = dict[str, Any]  # a JSON schema, a tool call's input: passed on as given
MaxTokens = Annotated[int, Field(ge=1, le=MAX_INT)]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=0, le=MAX_INT)]
Strings = Annotated[list[NonEmpty], OneOrList()]
# A message's or a block's content: a string, or a list of parts whose texts are joined.
TextOr = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[T], Tag(LIST)],
    Discriminator(
        json_kind,
        custom_error_type="content",
        custom_error_message="must be a string or a list of content parts",
    ),
]
