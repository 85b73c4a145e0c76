"""Where a model comes from: a local folder, or a Hugging Face hub id ``ORG/NAME[@REVISION]``.

Users of vLLM and SGLang name models by hub id. ``resolve_model`` turns either form into
the folder every process opens, through ``huggingface_hub.snapshot_download`` so that the
local cache, ``HF_HUB_OFFLINE``, ``HF_TOKEN``, ``HF_HOME`` and ``HF_HUB_CACHE`` behave as
users know them: a cached snapshot serves without a network, a missing one downloads where
the network allows. ``pdmesh up`` resolves once and hands the folder to every process.

``model_identity`` is what two processes compare to agree they serve the same weights (and
what the KV layout digest covers): a hub snapshot is its repository and commit, wherever
each machine keeps its cache; a plain folder is its name, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pdmesh.errors import UnsupportedModelError

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
"""``ORG/NAME`` with an optional ``@REVISION`` (branch, tag or commit)."""
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})/?$")
WEIGHT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt"]
"""What a download takes of a repository: config, weights, tokenizer and chat templates
(not the .bin, .gguf or ONNX copies many repositories also carry)."""


@dataclass(frozen=True)
class ModelSource:
    path: Path
    """The folder every process opens."""
    name: str
    """The model's name for clients: the hub id as typed, else the folder's name."""


def resolve_model(spec: str) -> ModelSource:
    """The folder behind ``spec`` (a folder, or a hub id fetched through the cache); a
    missing folder, a folder that is not a model and a hub id that cannot be fetched are
    each refused with their own message."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(_check_folder(path), identity_name(path))
    match = HUB_ID.match(spec)
    if match is None or spec.startswith(("/", ".", "~")) or path.exists():
        raise UnsupportedModelError(f"{spec}: no such folder (give a Hugging Face model folder, "
                                    "or a hub id such as Qwen/Qwen3-0.6B)")
    folder = _snapshot(match["repo"], match["revision"])
    return ModelSource(_check_folder(folder), spec)


def model_path(spec: str) -> str:
    """``resolve_model(spec).path`` as text, for config fields that hold a folder."""
    return str(resolve_model(spec).path)


def identity_name(path: str | Path) -> str:
    """``ORG/NAME@COMMIT`` for a folder in a Hugging Face cache, else the folder's name."""
    resolved = Path(path).expanduser().resolve()
    match = _SNAPSHOT.search(resolved.as_posix())
    if match is None:
        return resolved.name
    return f"{match['org']}/{match['name']}@{match['commit']}"


def display_name(path: str | Path) -> str:
    """``ORG/NAME`` for a folder in a Hugging Face cache, else the folder's name."""
    return identity_name(path).split("@", 1)[0]


def _check_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise UnsupportedModelError(f"{path}: no config.json (is this a Hugging Face model folder?)")
    return path


def _snapshot(repo: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=WEIGHT_FILES))
    except RepositoryNotFoundError as exc:
        raise UnsupportedModelError(f"{repo}: no such repository on the Hugging Face hub, or it is "
                                    "gated and HF_TOKEN does not grant it") from exc
    except LocalEntryNotFoundError as exc:
        from huggingface_hub import constants

        where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
        rev = f" at revision {revision!r}" if revision else ""
        how = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
               else "the hub cannot be reached from this machine")
        raise UnsupportedModelError(f"{repo}{rev} is not in {where} and {how}; download it where the hub "
                                    "is reachable (huggingface-cli download ...) into that cache, "
                                    "or pass the model's folder") from exc
    except HfHubHTTPError as exc:
        raise UnsupportedModelError(f"{repo}: the hub refused the download: {exc}") from exc
