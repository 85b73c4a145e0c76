"""OpenAI request bodies -> prompts and ``SamplingParams`` (validated by the same
``SamplingParams`` the gRPC front builds, so the two fronts accept exactly the same values)."""

from __future__ import annotations

from typing import Any

from pdmesh.errors import InvalidRequestError
from pdmesh.sampling_params import SamplingParams
from services.router.core import RouterCore
from services.router.http.errors import HTTPError
from services.router.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)

_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
           "repetition_penalty", "min_tokens", "ignore_eos", "include_stop_str_in_output", "priority",
           "num_speculative_tokens", "skip_special_tokens")


def sampling(req: CompletionRequest | ChatCompletionRequest, max_tokens: int, logprobs: int | None
             ) -> SamplingParams:
    options: dict[str, Any] = {k: getattr(req, k) for k in _PASSED if getattr(req, k) is not None}
    if req.stop is not None:
        options["stop"] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    if req.stop_token_ids:
        options["stop_token_ids"] = tuple(req.stop_token_ids)
    options.update(n=req.n, max_tokens=max_tokens, logprobs=logprobs, output_kind="delta",
                   cache_salt=req.cache_salt or None)
    return SamplingParams.from_dict(options)


def check_model(core: RouterCore, model: str | None) -> None:
    if model is not None and model not in core.served_names:
        raise HTTPError(404, f"the model {model!r} does not exist; this mesh serves "
                        f"{', '.join(map(repr, core.listed_names))}", "model", "model_not_found")


async def completion_prompts(core: RouterCore, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
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
            ids = await core.prompt_ids_async(item)
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


async def chat_prompt(core: RouterCore, messages: list[ChatMessage], add_generation_prompt: bool) -> list[int]:
    """The HTTP body's messages as the router's chat prompt (``RouterCore.chat_ids``)."""
    return await core.chat_ids([{"role": m.role, "content": _text(m)} for m in messages], add_generation_prompt)
