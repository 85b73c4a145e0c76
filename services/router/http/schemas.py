"""Request bodies of the OpenAI-compatible API (and the extras vLLM accepts).

Validated by pydantic: a wrong type is a 400 that names the field. Unknown fields are
ignored, as OpenAI's own server and vLLM do, so clients that send newer fields still work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdmesh.errors import InvalidRequestError

_SCALARS = {int, float, bool, type(None)}
"""What JSON numbers, booleans and null become: nothing in them to check."""


def _unicode_only(data: Any) -> None:
    """JSON may spell a lone UTF-16 surrogate (``"\\ud800"``), which Python decodes into a
    ``str`` that no tokenizer, protobuf field or gRPC header can take: refused here, with
    the field it is in, rather than failing deep in the request. Walked with a list, not
    recursion: a body nested as deep as the JSON parser allows must not exhaust the stack."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidRequestError(path or "body", f"is not valid Unicode text: a lone surrogate "
                                          f"{value[e.start]!r} at character {e.start}") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                todo.append((path or "body", key))
                todo.append((f"{path}.{key}" if path else str(key), item))
        elif isinstance(value, list) and not set(map(type, value)) <= _SCALARS:  # token ids: no walk
            todo.extend((f"{path}[{i}]", item) for i, item in enumerate(value) if type(item) not in _SCALARS)


class _Body(BaseModel):
    """A request body: unknown fields ignored, every string in it valid Unicode."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _check_text(cls, data: Any) -> Any:
        _unicode_only(data)
        return data


_UNSUPPORTED = {
    "logit_bias": "per-token logit biases",
    "best_of": "best-of-n selection (ask for n completions instead)",
    "functions": "the legacy function calling (send tools instead)",
    "function_call": "the legacy function calling (send tools and tool_choice instead)",
    "truncate_prompt_tokens": "prompt truncation (send a shorter prompt)",
    "logits_processors": "custom logits processors",
}
"""Fields of OpenAI's API (or vLLM's extras) that would change what is generated and that
pdmesh does not implement. Unknown fields are ignored, but ignoring one of these would
hand back output the caller did not ask for (free text for a JSON schema, unbiased
tokens), so a value that asks for the feature is a 400 naming the field."""


def _asks_for(name: str, value: Any, data: dict[str, Any]) -> bool:
    """Whether ``value`` turns the feature on: unset, empty and the API's own "off"
    values (``function_call`` none, ``best_of`` equal to n) do not."""
    if value is None or value == {} or value == [] or value is False:
        return False
    if name == "response_format":
        return not (isinstance(value, dict) and value.get("type") == "text")
    if name == "function_call":
        return value not in ("none", "auto")  # auto without functions picks none
    if name == "best_of":
        return value != data.get("n", 1)
    return True


def _supported_only(data: Any) -> None:
    if not isinstance(data, dict):
        return
    for name, feature in _UNSUPPORTED.items():
        if name in data and _asks_for(name, data[name], data):
            raise InvalidRequestError(name, f"{feature} is not supported by pdmesh; leave {name} unset")


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(_Body):
    @model_validator(mode="before")
    @classmethod
    def _check_features(cls, data: Any) -> Any:
        _supported_only(data)
        return data

    model: str | None = None
    """Optional, as vLLM's: a request without it is for the mesh's model."""
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Extras vLLM accepts.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    priority: int | None = None
    num_speculative_tokens: int | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    cache_salt: str | None = None
    return_token_ids: bool = False
    request_id: str | None = None
    # Structured outputs: OpenAI's response_format (chat), vLLM's structured_outputs and its
    # older guided_* fields; at most one of them (services/router/http/structured.py).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str
    """JSON text, as the API sends it (a template receives it parsed)."""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant turn's calls (sent back with their results in the next request)."""
    tool_call_id: str | None = None
    """A tool message: which call this is the result of."""
    name: str | None = None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDef


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """"none", "auto", "required" or ``{"type": "function", "function": {"name": ...}}``."""
    parallel_tool_calls: bool = True


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class ResponsesRequest(_Body):
    """OpenAI's Responses API (``POST /v1/responses``), stateless: each request carries its
    whole conversation, so ``previous_response_id`` is refused and ``store`` ignored."""

    @model_validator(mode="before")
    @classmethod
    def _check_stateless(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("previous_response_id"):
            raise InvalidRequestError("previous_response_id", "pdmesh keeps no responses: send the whole "
                                      "conversation in input instead")
        return data

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    """Function tools in the Responses shape: ``{"type": "function", "name", "parameters"}``."""
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    """``{"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"}}``."""
    stream: bool = False
    user: str | None = None
