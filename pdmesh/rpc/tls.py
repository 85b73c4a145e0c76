"""TLS and mutual TLS for every gRPC hop, from three PEM files.

``--tls-cert`` / ``--tls-key`` are this process's certificate chain and key: a server
presents them, and so does every channel it opens to other pdmesh services, which makes
the mesh mutually authenticated when ``--tls-ca`` is given (servers then require a client
certificate signed by that CA). Without a CA, peers are verified against ``--tls-cert``
itself (one self-signed certificate shared by the mesh). The process-wide setting is made
once at start-up by the service's ``create_server`` (``configure``); ``rpc/clients.py``
reads it for every channel. KV blocks move over NIXL/UCX, not gRPC: secure that fabric
at the network layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from pdmesh.errors import InvalidRequestError


@dataclass(frozen=True)
class TLSFiles:
    cert: bytes
    key: bytes
    ca: bytes | None
    """Root for verifying peers; when set, servers also require client certificates."""

    @classmethod
    def load(cls, cert: str, key: str, ca: str = "") -> TLSFiles | None:
        """None when no certificate is configured; an error naming the flag when the set
        is incomplete or a file cannot be read."""
        if not cert and not key:
            if ca:
                raise InvalidRequestError("tls_ca", "needs --tls-cert and --tls-key as well")
            return None
        if not cert or not key:
            raise InvalidRequestError("tls_cert" if not cert else "tls_key",
                                      "--tls-cert and --tls-key go together")

        def read(flag: str, path: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise InvalidRequestError(flag, f"cannot read {path}: {exc.strerror}") from exc

        return cls(read("tls_cert", cert), read("tls_key", key), read("tls_ca", ca) if ca else None)

    @property
    def mutual(self) -> bool:
        return self.ca is not None

    def server_credentials(self, require_client_auth: bool = True) -> grpc.ServerCredentials:
        """``require_client_auth`` (with a CA) makes it mutual; a public port may turn it off
        and authenticate clients by API key instead."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.mutual and require_client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca or self.cert,
                                            private_key=self.key, certificate_chain=self.cert)


_current: TLSFiles | None = None


def configure(files: TLSFiles | None) -> None:
    """Set this process's TLS material (servers and every channel it opens)."""
    global _current
    _current = files


def current() -> TLSFiles | None:
    return _current
