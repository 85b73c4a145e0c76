"""Serve the HTTP app inside the router's own event loop (uvicorn, no extra process or hop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn

from pdmesh.rpc.process import listen_socket
from services.router.http.app import create_app
from services.router.router import Router


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the router owns SIGTERM and drains both fronts."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HTTPFront:
    def __init__(self, router: Router, host: str, port: int, api_key: str,
                 tls_cert: str = "", tls_key: str = "") -> None:
        """HTTPS with the router's certificate when one is configured (HTTP clients are
        authenticated by the API key, not by client certificates)."""
        config = uvicorn.Config(create_app(router, api_key), host=host, port=port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=10,
                                ssl_certfile=tls_cert or None, ssl_keyfile=tls_key or None)
        self.server = _EmbeddedServer(config)
        self.task: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 30.0) -> int:
        """Start serving; returns the bound port. A taken port is a ``BindError`` naming
        ``--http-port`` (uvicorn would log it and exit the process from inside its task)."""
        config = self.server.config
        sock = listen_socket(config.host, config.port, "--http-port")
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises why it could not start (port taken ...)
                raise OSError("the HTTP server stopped before it started")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the HTTP server did not start within {timeout:.0f}s")
            await asyncio.sleep(0.01)
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop accepting, let in-flight responses finish (bounded by uvicorn's grace)."""
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

