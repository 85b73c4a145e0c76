"""Tokenizer from ``tokenizer.json`` (+ ``tokenizer_config.json`` for specials and chat)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from pdmesh.chat_template import ChatTemplate, token_text
from pdmesh.errors import UnsupportedModelError


class Tokenizer:
    """Encodes like ``transformers``' fast tokenizer for the same folder (special tokens included)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise UnsupportedModelError(f"{path}: no tokenizer.json")
        self._tok = _HFTokenizer.from_file(str(file))
        cfg_file = path / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        self._chat = ChatTemplate(path, self.config)
        self.eos_token_id = self._special_id("eos_token")
        self.bos_token_id = self._special_id("bos_token")
        self.special_ids = frozenset(
            tid for tid, tok in self._tok.get_added_tokens_decoder().items() if tok.special
        )

    def _special_id(self, key: str) -> int | None:
        value = token_text(self.config.get(key))
        return self._tok.token_to_id(value) if value else None

    @property
    def chat_template(self) -> str | None:
        """The template chat requests render with (``chat_template.py`` says where it is found)."""
        return self._chat.source

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def json_text(self) -> str:
        """The whole tokenizer as ``tokenizer.json`` holds it (what llguidance reads)."""
        return self._tok.to_str()

    def vocab_strings(self) -> list[str]:
        """Every token's string form (byte-level tokens as their escaped characters)."""
        return list(self._tok.get_vocab(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render ``messages`` (and the ``tools`` the model may call) with the folder's chat
        template, as ``transformers`` would."""
        return self._chat.render(messages, add_generation_prompt, tools)
