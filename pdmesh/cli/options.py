"""Flags from config dataclasses: one ``--flag`` per field, with its docstring and default.

Flags default to None so ``load_config`` can layer YAML, then ``PDMESH_*`` environment
variables, then the flags a user actually typed; the help shows the dataclass default.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from pdmesh.service_config import field_docs, load_config

_MISSING = dataclasses.MISSING


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not _MISSING:
        return "unset" if f.default in ("", None) else repr(f.default).strip("'")
    if f.default_factory is not _MISSING:
        return repr(f.default_factory())
    return "required"


def add_config_flags(p: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                     config_file: bool = True) -> None:
    """Every field of a config dataclass becomes a --flag."""
    if config_file:
        p.add_argument("--config", metavar="FILE.yaml",
                       help="YAML file with the same option names (flags override it)")
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                       metavar=f.name.upper(),
                       help=f"{docs.get(f.name, '')} (default: {_default_text(f)})".strip())


def config_from_args(args: argparse.Namespace, cls: type, env_prefix: str | None) -> Any:
    """Build ``cls`` from ``--config``, the environment and the flags that were given."""
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
    return load_config(cls, getattr(args, "config", None), env_prefix, overrides)


def resolve_model_field(cfg: Any) -> Any:
    """``cfg`` with its ``model`` resolved to a folder (a hub id fetched through the Hugging
    Face cache, ``pdmesh/model/source.py``) and, for a config that names the served model
    (the router's), that name defaulted to what the user typed. Kept apart from
    ``config_from_args``, which only parses (the deploy checks parse configs whose folders
    exist only in their images)."""
    if not getattr(cfg, "model", ""):
        return cfg
    from pdmesh.model.source import resolve_model

    source = resolve_model(cfg.model)
    changes: dict[str, Any] = {"model": str(source.path)}
    if hasattr(cfg, "served_model_name") and not cfg.served_model_name:
        changes["served_model_name"] = (source.name,)
    return dataclasses.replace(cfg, **changes)
