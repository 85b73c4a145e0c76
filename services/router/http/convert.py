"""OpenAI request bodies -> prompts and ``SamplingParams`` (validated by the same
``SamplingParams`` the gRPC front builds, so the two fronts accept exactly the same values)."""

from __future__ import annotations

import json
from typing import Any

from pdmesh.errors import InvalidRequestError
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.spec import StructuredOutput
from services.router.http.errors import HTTPError
from services.router.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from services.router.router import Router

_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
           "repetition_penalty", "min_tokens", "ignore_eos", "include_stop_str_in_output", "priority",
           "num_speculative_tokens", "skip_special_tokens")


def sampling(req: CompletionRequest | ChatCompletionRequest, max_tokens: int, logprobs: int | None,
             structured_output: StructuredOutput | None = None, keep_special_tokens: bool = False
             ) -> SamplingParams:
    options: dict[str, Any] = {k: getattr(req, k) for k in _PASSED if getattr(req, k) is not None}
    if structured_output is not None:
        options["structured_output"] = structured_output
    if keep_special_tokens:  # a tool-call parser reads a marker that is a special token
        options["skip_special_tokens"] = False
    if req.stop is not None:
        options["stop"] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    if req.stop_token_ids:
        options["stop_token_ids"] = tuple(req.stop_token_ids)
    prompt_lps = req.prompt_logprobs
    if getattr(req, "echo", False) and logprobs is not None:  # echo with logprobs covers the prompt too
        prompt_lps = max(prompt_lps or 0, logprobs)
    options.update(n=req.n, max_tokens=max_tokens, logprobs=logprobs, output_kind="delta",
                   cache_salt=req.cache_salt or None, prompt_logprobs=prompt_lps)
    return SamplingParams.from_dict(options)


def check_model(router: Router, model: str | None) -> None:
    if model is not None and model not in router.served_names:
        raise HTTPError(404, f"the model {model!r} does not exist; this mesh serves "
                        f"{', '.join(map(repr, router.listed_names))}", "model", "model_not_found")


async def completion_prompts(router: Router, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
    """``(prompt text or None, token ids)`` for each prompt of a completions request."""
    if req.suffix is not None:
        raise HTTPError(400, "suffix is not supported (no fill-in-the-middle): leave it unset", "suffix")
    p = req.prompt
    if isinstance(p, str):
        texts: list[str | list[int]] = [p]
    elif p and all(isinstance(x, int) for x in p):
        texts = [p]  # type: ignore[list-item]
    else:
        texts = list(p)  # type: ignore[arg-type]
    if not texts:
        raise HTTPError(400, "prompt must not be empty", "prompt")
    out = []
    for item in texts:
        try:
            ids = await router.prompt_ids_async(item)
        except InvalidRequestError as exc:
            raise HTTPError(400, exc.message, "prompt") from exc
        out.append((item if isinstance(item, str) else None, ids))
    return out


def _text(message: ChatMessage) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise HTTPError(400, f"message content part of type {part.get('type')!r} is not supported "
                            "(text only)", "messages")
        parts.append(part["text"])
    return "".join(parts)


def _message(m: ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it (``transformers``' convention): a tool call's
    arguments as an object, not the JSON text the API carries."""
    out: dict[str, Any] = {"role": m.role, "content": _text(m)}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _loaded(c.function.arguments)}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _loaded(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


async def chat_prompt(router: Router, messages: list[ChatMessage], add_generation_prompt: bool,
                      tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The HTTP body's messages as the router's chat prompt (``Router.chat_ids``)."""
    return await router.chat_ids([_message(m) for m in messages], add_generation_prompt, tools)
