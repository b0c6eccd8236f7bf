"""The OpenAI request bodies `mlx-cluster serve` takes, declared: POST /v1/chat/completions
(ChatBody) and POST /v1/completions (CompletionBody) with their messages and content parts, tools
and tool_choice, response_format, prediction, logprobs, stream_options and sampling fields.
openai_api.py turns a checked body into rank 0's request; GET /openapi.json publishes these
schemas (http/openapi.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag

from launcher.serve.request_api import MAX_SEED
from launcher.serve.request_errors import Name
from launcher.serve.request_models import (
    LIST,
    OBJECT,
    STRING,
    TOKEN_ID_PATTERN,
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
    json_kind,
    named_once,
    needs,
    refusing,
    tagged_by,
)

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_CHOICES = 8  # n: each choice is one more sequence in the batch
MAX_TOP_LOGPROBS = {"chat": 20, "completion": 5}  # as OpenAI
MAX_TOOLS = 128  # as OpenAI
# Content parts other than text, and what they are, for the 400 that refuses them.
REFUSED_PARTS = {
    "image_url": "images",
    "image": "images",
    "input_image": "images",
    "input_audio": "audio",
    "audio": "audio",
    "file": "files",
    "input_file": "files",
}
TEXT_PART = "must be a string: text parts need a string 'text'"
# OpenAI's `param` where it is not the error's own location: a message's role and content, and
# these objects' insides, are named as a whole, as this server always named them.
PARAMS = {
    "messages[]": Name("messages"),
    "messages[].content": Name("messages"),
    "messages[].content[]": Name("messages"),
    "messages[].content[].text": Name("messages", TEXT_PART),
    "messages[].tool_calls[].function.arguments": Name(
        "messages[].tool_calls[].function", "must be a string of JSON"
    ),
    "stream_options.include_usage": Name("stream_options"),
    "response_format.json_schema": Name("response_format.json_schema.schema"),
    "logit_bias.*": Name("logit_bias"),
    "stop[]": Name("stop"),
    "prompt[]": Name("prompt"),
    "tool_choice.type": Name("tool_choice"),
    "tool_choice.function": Name("tool_choice"),
    "prediction.type": Name("prediction"),
    "prediction.content": Name("prediction"),
    "prediction.content[]": Name("prediction"),
    "prediction.content[].text": Name("prediction", TEXT_PART),
}


class TextPart(Part):
    """A content part: text (images, audio and files are refused by name)."""

    type: Annotated[Literal["text"], refusing(REFUSED_PARTS)]
    text: str


class Message(Part):
    """What every chat message may carry: audio (a spoken earlier answer) is refused."""

    audio: Annotated[Any, Only(None, "mlx-cluster serve takes text only")] = None


class TextMessage(Message):
    """A system, developer (OpenAI's newer name for system) or user message."""

    role: Literal["system", "developer", "user"]
    content: TextOr[TextPart]


class CalledFunction(Part):
    name: ToolName
    arguments: str = "{}"  # JSON text, as the model wrote it


class ToolCall(Part):
    id: NonEmpty
    type: Literal["function"] = "function"
    function: CalledFunction


class AssistantMessage(Message):
    """An earlier answer: its text, its tool calls, or both."""

    role: Literal["assistant"]
    content: TextOr[TextPart] | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None


class ToolMessage(Message):
    """A tool call's result."""

    role: Literal["tool"]
    content: TextOr[TextPart]
    tool_call_id: NonEmpty


TEXT_ROLE = "<text>"
ChatMessage = Annotated[
    Annotated[TextMessage, Tag(TEXT_ROLE)]
    | Annotated[AssistantMessage, Tag("<assistant>")]
    | Annotated[ToolMessage, Tag("<tool>")],
    Discriminator(
        tagged_by(
            "role",
            {
                "system": TEXT_ROLE,
                "developer": TEXT_ROLE,
                "user": TEXT_ROLE,
                "assistant": "<assistant>",
                "tool": "<tool>",
            },
        ),
        custom_error_type="role",
        custom_error_message="needs a 'role' among system, developer, user, assistant, tool",
    ),
]


class FunctionDef(Part):
    name: ToolName
    description: str | None = None
    parameters: JsonObject | None = None  # a JSON schema
    strict: bool | None = None  # strict mode: see strict_schema.py


class FunctionTool(Part):
    """A tool: a function (the only kind served)."""

    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Part):
    name: ToolName


class NamedChoice(Part):
    type: Literal["function"]
    function: ChosenFunction


ToolChoiceValue = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag(STRING)]
    | Annotated[NamedChoice, Tag(OBJECT)],
    Discriminator(
        json_kind,
        custom_error_type="tool_choice",
        custom_error_message="must be 'auto', 'none', 'required' or a function by name",
    ),
]


class TextFormat(Part):
    type: Literal["text"]


class JsonObjectFormat(Part):
    type: Literal["json_object"]


class JsonSchemaSpec(Part):
    name: str | None = None
    description: str | None = None
    schema_: JsonObject = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(Part):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("<text>")]
    | Annotated[JsonObjectFormat, Tag("<json_object>")]
    | Annotated[JsonSchemaFormat, Tag("<json_schema>")],
    Discriminator(
        tagged_by(
            "type",
            {"text": "<text>", "json_object": "<json_object>", "json_schema": "<json_schema>"},
        ),
        custom_error_type="response_format",
        custom_error_message="must have a 'type' of 'text', 'json_object' or 'json_schema'",
    ),
]


class Prediction(Part):
    """OpenAI's Predicted Outputs: text the answer likely repeats (it only drafts tokens)."""

    type: Literal["content"]
    content: TextOr[TextPart]


class StreamOptions(Part):
    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2, le=2)]
TokenId = Annotated[str, Field(pattern=TOKEN_ID_PATTERN)]
TokenBias = Annotated[float, Field(ge=-100, le=100)]


class OpenAIBody(Body):
    """What both routes take: sampling, stop strings, streaming and the output's form."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None  # max_tokens' newer name: it wins
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: TopP = 1.0
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: Strings = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    top_k: TopK = 0
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[TokenId, TokenBias] = Field(default_factory=dict)
    response_format: ResponseFormat | None = None
    prediction: Prediction | None = None
    # Taken only at their neutral value: anything else would change the answer unannounced.
    best_of: Annotated[Any, Only(1)] = 1
    echo: Annotated[Any, Only(False)] = False
    suffix: Annotated[Any, Only(None)] = None
    functions: Annotated[Any, Only(None)] = None
    function_call: Annotated[Any, Only(None)] = None
    audio: Annotated[Any, Only(None)] = None
    _streamed = needs("stream_options", "stream", "is taken only with 'stream': true")


class ChatBody(OpenAIBody):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: Annotated[list[FunctionTool], named_once("function", "name")] = Field(
        default_factory=list, max_length=MAX_TOOLS
    )
    tool_choice: ToolChoiceValue | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS["chat"])] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    _with_logprobs = needs("top_logprobs", "logprobs", "needs 'logprobs': true")


def _batch_of_one(prompt: Any) -> Any:
    one = isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list)
    return prompt[0] if one else prompt


Prompt = Annotated[
    Annotated[NonEmpty, Tag(STRING)]
    | Annotated[list[Annotated[int, Field(ge=0)]], Tag(LIST), Field(min_length=1)],
    Discriminator(
        json_kind,
        custom_error_type="prompt",
        custom_error_message="must be one non-empty string or one list of token ids",
    ),
    BeforeValidator(_batch_of_one),
]


class CompletionBody(OpenAIBody):
    """POST /v1/completions: one prompt, as a string or token ids (a batch of one is taken)."""

    prompt: Prompt
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS["completion"])] | None = None
    # Chat's options: refused unless neutral, as they always were.
    n: Annotated[Any, Only(1)] = 1
    top_logprobs: Annotated[Any, Only(None)] = None
    tools: Annotated[Any, Only(None)] = None
    tool_choice: Annotated[Any, Only(None)] = None
