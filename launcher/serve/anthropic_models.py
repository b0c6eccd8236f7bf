"""The Anthropic request bodies `mlx-cluster serve` takes, declared: POST /v1/messages
(MessagesBody) and POST /v1/messages/count_tokens (CountTokensBody) with their system prompt,
messages and content blocks (text, tool_use, tool_result), tools, tool_choice, output_config and
sampling fields. anthropic_api.py turns a checked body into rank 0's request; GET /openapi.json
publishes these schemas (http/openapi.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag
from pydantic.json_schema import SkipJsonSchema

from launcher.serve.request_errors import Name
from launcher.serve.request_models import (
    OTHER,
    Body,
    JsonObject,
    MaxTokens,
    NonEmpty,
    Only,
    Part,
    Strings,
    TextOr,
    ToolName,
    TopK,
    TopP,
    named_once,
    refusing,
    tagged_by,
)

MAX_STOP_SEQUENCES = 16  # Anthropic sets no limit; rank 0 scans each at every delta
MAX_TOOLS = 128
REFUSED_BLOCKS = {"image": "images", "document": "documents", "file": "files"}
# The error's `param` (kept on ApiError; Anthropic's error shape has none) where it is not the
# error's own location, as this server always named them.
PARAMS = {
    "messages[]": Name("messages[].role"),
    "tool_choice.disable_parallel_tool_use": Name("tool_choice"),
    "output_config.format.*": Name("output_config.format"),
    "stop_sequences[]": Name("stop_sequences"),
}


class TextBlock(Part):
    """A text block (images and documents are refused by name)."""

    type: Annotated[Literal["text"], refusing(REFUSED_BLOCKS)]
    text: str


class ToolUseBlock(Part):
    """An earlier tool call of the assistant's."""

    type: Literal["tool_use"]
    id: NonEmpty
    name: ToolName
    input: JsonObject = Field(default_factory=dict)


class ToolResultBlock(Part):
    """A tool call's result, in the user's turn."""

    type: Literal["tool_result"]
    tool_use_id: NonEmpty
    content: TextOr[TextBlock] = ""


class UserOther(Part):
    """Any other block in a user's turn: its `type` says which are taken there."""

    type: Annotated[Literal["text", "tool_result"], refusing(REFUSED_BLOCKS)]


class AssistantOther(Part):
    """Any other block in an assistant's turn: its `type` says which are taken there."""

    type: Annotated[Literal["text", "tool_use"], refusing(REFUSED_BLOCKS)]


SERVER_TOOL = "must be 'custom' or left out: only client tools are served"
NOT_A_BLOCK = "must be a content block (an object with its 'type')"
UserBlock = Annotated[
    Annotated[TextBlock, Tag("<text>")]
    | Annotated[ToolResultBlock, Tag("<tool_result>")]
    | Annotated[SkipJsonSchema[UserOther], Tag(OTHER)],
    Discriminator(
        tagged_by("type", {"text": "<text>", "tool_result": "<tool_result>"}, OTHER),
        custom_error_type="block",
        custom_error_message=NOT_A_BLOCK,
    ),
]
AssistantBlock = Annotated[
    Annotated[TextBlock, Tag("<text>")]
    | Annotated[ToolUseBlock, Tag("<tool_use>")]
    | Annotated[SkipJsonSchema[AssistantOther], Tag(OTHER)],
    Discriminator(
        tagged_by("type", {"text": "<text>", "tool_use": "<tool_use>"}, OTHER),
        custom_error_type="block",
        custom_error_message=NOT_A_BLOCK,
    ),
]


class UserTurn(Part):
    """A user's message: text, and the results of the assistant's tool calls."""

    role: Literal["user"]
    content: TextOr[UserBlock]


class AssistantTurn(Part):
    """An earlier answer: text, and tool calls."""

    role: Literal["assistant"]
    content: TextOr[AssistantBlock]


Message = Annotated[
    Annotated[UserTurn, Tag("<user>")] | Annotated[AssistantTurn, Tag("<assistant>")],
    Discriminator(
        tagged_by("role", {"user": "<user>", "assistant": "<assistant>"}),
        custom_error_type="role",
        custom_error_message="needs a 'role' of 'user' or 'assistant'",
    ),
]


class ClientTool(Part):
    """A tool the client runs (Anthropic's server tools run on Anthropic's servers)."""

    type: Annotated[Any, Only("custom", SERVER_TOOL)] = "custom"
    name: ToolName
    description: str | None = None
    input_schema: JsonObject  # a JSON schema
    strict: bool | None = None  # strict mode: see strict_schema.py


class ChoiceOptions(Part):
    disable_parallel_tool_use: bool | None = None


class ModeChoice(ChoiceOptions):
    type: Literal["auto", "any", "none"]


class NamedToolChoice(ChoiceOptions):
    type: Literal["tool"]
    name: ToolName


ToolChoiceValue = Annotated[
    Annotated[ModeChoice, Tag("<mode>")] | Annotated[NamedToolChoice, Tag("<tool>")],
    Discriminator(
        tagged_by("type", {"auto": "<mode>", "any": "<mode>", "none": "<mode>", "tool": "<tool>"}),
        custom_error_type="tool_choice",
        custom_error_message="must have a 'type' of 'auto', 'any', 'tool' or 'none'",
    ),
]


class JsonSchemaOutput(Part):
    type: Literal["json_schema"]
    schema_: JsonObject = Field(alias="schema")


class OutputConfig(Part):
    """Structured output (`format`); its other keys (effort) change nothing here."""

    format: JsonSchemaOutput | None = None


class CountTokensBody(Body):
    """POST /v1/messages/count_tokens: the prompt as the chat template renders it, tools too."""

    model: str | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    system: TextOr[TextBlock] | None = None
    tools: Annotated[list[ClientTool], named_once("name")] = Field(
        default_factory=list, max_length=MAX_TOOLS
    )
    tool_choice: ToolChoiceValue | None = None


class MessagesBody(CountTokensBody):
    """POST /v1/messages."""

    max_tokens: MaxTokens
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    stop_sequences: Strings = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)
    output_config: OutputConfig | None = None
