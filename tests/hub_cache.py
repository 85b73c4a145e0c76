"""A Hugging Face hub cache laid out as ``huggingface_hub`` lays it out, from a model folder:
``models--ORG--NAME/{blobs,refs,snapshots}``, snapshot files linked to content-addressed
blobs, ``refs/main`` naming the commit. Tests point ``HF_HUB_CACHE`` at it, offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_hub_cache(cache: Path, repo: str, folder: Path, commit: str = COMMIT) -> Path:
    """Put ``folder``'s files into ``cache`` as ``repo`` at ``commit`` (``main`` points at
    it); returns the snapshot folder."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot
