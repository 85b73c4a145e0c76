"""The typed errors every pdmesh layer raises; the RPC layer maps each to one status code.

Two ways to fail: *capacity* errors mean "not now" and are retryable; everything else is
either the caller's mistake (``InvalidRequestError``) or a broken invariant that should
surface immediately.
"""

from __future__ import annotations


class PdmeshError(Exception):
    """Base class for errors pdmesh raises on purpose."""


class InvalidRequestError(PdmeshError, ValueError):
    """The request or its sampling parameters are invalid; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CapacityError(PdmeshError):
    """Out of KV blocks or queue slots right now; retrying later may succeed."""


class UnknownRequestError(PdmeshError, KeyError):
    """No live request has this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown request"


class UnsupportedModelError(PdmeshError, ValueError):
    """The model folder uses an architecture or config field pdmesh cannot serve exactly."""


class IncompatibleWorkerError(PdmeshError):
    """Two workers disagree on model, dtype, block size or hash settings."""


class TransferFailedError(PdmeshError):
    """A KV transfer did not complete (dead peer, deadline, NIXL error)."""


class UnavailableError(PdmeshError):
    """No healthy worker can take the request, or this server is draining."""


class StartError(PdmeshError, RuntimeError):
    """A process of the mesh did not start (it exited, or was not ready in time); the
    message ends with its log's last lines, which say why."""


class BindError(PdmeshError, OSError):
    """This process cannot listen where it was told: the port is taken, or the address is
    not one of this machine's."""

    @classmethod
    def at(cls, address: str, flag: str = "--port") -> BindError:
        """The one message for every listener (gRPC, HTTP, metrics), naming its flag."""
        return cls(f"cannot listen on {address}: the port is taken, or the address is not this machine's "
                   f"(pick another {flag}, or 0 for any free one)")
