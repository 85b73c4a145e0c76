"""Service configuration: a frozen dataclass filled from YAML, then environment, then flags.

Parsed once at start-up by each service's ``__main__`` and passed down. Unknown keys are
errors (a typo in a manifest must not be silently ignored); values are coerced to the
field's type.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pdmesh.errors import InvalidRequestError

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """What every pdmesh server process has: where it listens and how it stops."""

    host: str = "127.0.0.1"
    """Interface to bind (0.0.0.0 for all)."""
    port: int = 0
    """gRPC port; 0 picks a free one (written to port_file)."""
    port_file: str = ""
    """Where to write the bound port, for launchers that start on port 0."""
    advertise_address: str = ""
    """host:port other processes dial to reach this one (empty: host:port, or this
    machine's hostname when host is a wildcard such as 0.0.0.0)."""
    metrics_port: int = -1
    """Prometheus /metrics port: -1 off, 0 any free port (written to {port_file}.metrics)."""
    drain_grace_s: float = 10.0
    """On SIGTERM, how long in-flight calls may finish."""
    tls_cert: str = ""
    """PEM certificate chain: serve gRPC over TLS and present it to other pdmesh services
    (empty: plaintext)."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_ca: str = ""
    """PEM CA: verify peers with it and require client certificates (mutual TLS); empty:
    peers are verified against tls_cert itself."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field, through the class hierarchy (for --help)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str)
                                                      and value.lower() in ("", "none", "null"))):
            return None
        present = [a for a in args if a is not type(None)]
        return _coerce(name, value, present[0])
    if origin is typing.Literal:
        if value not in args:
            raise InvalidRequestError(name, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin in (tuple, list):
        items = value.split(",") if isinstance(value, str) else list(value)
        items = [i.strip() if isinstance(i, str) else i for i in items if i != ""]
        inner = args[0] if args else str
        return tuple(_coerce(name, i, inner) for i in items)
    try:
        if annotation is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if annotation in (int, float, str):
            return annotation(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(name, f"expected {annotation.__name__}, got {value!r}") from exc
    return value


def load_config(
    cls: type[T],
    file: str | Path | None = None,
    env_prefix: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from a YAML file, ``{env_prefix}FIELD`` variables and explicit overrides."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    if file:
        loaded = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise InvalidRequestError("config", f"{file} must hold a mapping of options")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
    if env_prefix:
        env = os.environ if environ is None else environ
        for name in fields:
            key = env_prefix + name.upper()
            if key in env:
                values[name] = env[key]
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise InvalidRequestError(unknown[0], f"unknown option; known options are {sorted(fields)}")
    return cls(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})
