"""Where requests go: a pdmesh router over gRPC, or any OpenAI-compatible base URL.

Each ``send`` streams one request and records its timeline (first token, every later
chunk, end, tokens, cached tokens) in a ``Record``; failures are recorded, not raised.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Record:
    start: float
    prompt_tokens: int = 0
    first: float | None = None
    """Time of the first output token."""
    chunks: list[float] = field(default_factory=list)
    """Arrival time of every streamed chunk with tokens."""
    end: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.end is not None


GREEDY = {"temperature": 0.0, "top_p": 1.0}


class Target(Protocol):
    name: str

    async def send(self, prompt: list[int] | str, max_tokens: int, record: Record) -> None: ...

    async def close(self) -> None: ...


class GrpcTarget:
    def __init__(self, address: str, security: Any = None, sampling: dict[str, float] | None = None) -> None:
        """``security``: a ``pdmesh.client.Security`` (TLS material, API key) or None;
        ``sampling``: temperature and top_p (greedy when absent)."""
        from pdmesh.client import AsyncClient

        self.sampling = sampling or GREEDY
        secure = security is not None and security.credentials() is not None
        self.name = f"{'grpcs' if secure else 'grpc'}://{address}"
        self.client = AsyncClient(address, security=security)

    async def send(self, prompt: list[int] | str, max_tokens: int, record: Record) -> None:
        import grpc

        try:
            async for resp in self.client.generate(prompt, max_tokens=max_tokens, ignore_eos=True,
                                                   **self.sampling):
                now = time.perf_counter()
                if resp.token_ids:
                    record.first = record.first or now
                    record.chunks.append(now)
                    record.token_ids.extend(resp.token_ids)
                if resp.finish_reason:
                    record.output_tokens = resp.usage.completion_tokens
                    record.prompt_tokens = resp.usage.prompt_tokens
                    record.cached_tokens = resp.usage.cached_tokens
                    record.end = now
        except grpc.aio.AioRpcError as exc:
            record.error = f"{exc.code().name}: {exc.details()}"

    async def close(self) -> None:
        await self.client.close()


class OpenAITarget:
    """``/v1/completions`` with ``stream`` and ``include_usage``; token-id prompts as lists."""

    def __init__(self, base_url: str, model: str, api_key: str = "", sampling: dict[str, float] | None = None) -> None:
        import aiohttp

        self.sampling = sampling or GREEDY
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.name = self.base
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=3600))

    async def send(self, prompt: list[int] | str, max_tokens: int, record: Record) -> None:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                                **self.sampling, "ignore_eos": True, "stream": True,
                                "stream_options": {"include_usage": True}}
        try:
            async with self.session.post(self.base + "/v1/completions", json=body) as resp:
                if resp.status != 200:
                    record.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    self._chunk(json.loads(line[6:]), record, time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - connection refused / reset: recorded as a failed request
            record.error = f"{type(exc).__name__}: {exc}"
            return
        if record.end is None and not record.error:
            record.error = "stream ended without a finish_reason"

    @staticmethod
    def _chunk(data: dict[str, Any], record: Record, now: float) -> None:
        if "error" in data:
            record.error = str(data["error"].get("message"))
            return
        for choice in data.get("choices", []):
            if choice.get("text") or choice.get("token_ids"):
                record.first = record.first or now
                record.chunks.append(now)
                record.token_ids.extend(choice.get("token_ids") or [])
            if choice.get("finish_reason"):
                record.end = now
        usage = data.get("usage")
        if usage:
            record.output_tokens = usage.get("completion_tokens", 0)
            record.prompt_tokens = usage.get("prompt_tokens", 0)
            record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    async def close(self) -> None:
        await self.session.close()
