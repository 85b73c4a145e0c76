"""Chat templates found and rendered as ``transformers`` does, for the ways real model
folders carry them; a template that refuses a conversation is the caller's 400-class
error, never a crash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pdmesh.errors import InvalidRequestError, UnsupportedModelError
from pdmesh.tokenizer import Tokenizer

# What templates on the Hub use: raise_exception for roles out of order, a namespace,
# loop controls, tojson with non-ASCII text, the named special tokens as text.
HUB_LIKE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'stop' %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}"
    "[{{ m['role'] }}] {{ m['content'] | tojson }}{{ eos_token }}\n"
    "{% endfor %}{{ ns.n }}{% if tools is defined %}(tools {{ tools }}){% endif %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
MESSAGES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hello"}],
    [{"role": "user", "content": "naïve café ✓ 中文"}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "again"}],
]


def _folder(src: Path, dst: Path, config_changes: dict[str, Any], files: dict[str, str] | None = None) -> Path:
    dst.mkdir()
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(config_changes)
    config = {k: v for k, v in config.items() if v is not None}
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in (files or {}).items():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_text(text)
    return dst


def _reference(path: Path, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def test_a_folder_saved_by_transformers_today(llama_dir: Path, tmp_path: Path) -> None:
    """``save_pretrained`` writes the template to chat_template.jinja, not the config."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(llama_dir).save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    for msgs in MESSAGES:
        assert Tokenizer(tmp_path).apply_chat_template(msgs) == _reference(tmp_path, msgs)


@pytest.mark.parametrize("layout", ["config", "file", "named list", "file over config"])
def test_hub_helpers_and_layouts_render_as_transformers(llama_dir: Path, tmp_path: Path, layout: str) -> None:
    bos = {"__type": "AddedToken", "content": "<|bos|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    changes: dict[str, Any] = {"bos_token": bos, "chat_template": HUB_LIKE}
    files = {}
    if layout == "file":
        changes["chat_template"], files = None, {"chat_template.jinja": HUB_LIKE}
    elif layout == "named list":
        changes["chat_template"] = [{"name": "default", "template": HUB_LIKE}, {"name": "tool_use", "template": "x"}]
    elif layout == "file over config":
        changes["chat_template"], files = "{{ 'the config, not used' }}", {"chat_template.jinja": HUB_LIKE}
    path = _folder(llama_dir, tmp_path / "m", changes, files)
    ours = Tokenizer(path)
    for msgs in [*MESSAGES, [*MESSAGES[0], {"role": "stop", "content": ""}]]:
        for gen in (True, False):
            assert ours.apply_chat_template(msgs, gen) == _reference(path, msgs, gen)


def test_a_conversation_the_template_refuses_is_the_callers_error(llama_dir: Path, tmp_path: Path) -> None:
    import jinja2

    path = _folder(llama_dir, tmp_path / "m", {"chat_template": HUB_LIKE})
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        _reference(path, twice)  # transformers refuses it too
    with pytest.raises(InvalidRequestError, match="must alternate") as e:
        Tokenizer(path).apply_chat_template(twice)
    assert e.value.field == "messages"


def test_a_folder_without_a_usable_template_says_why(llama_dir: Path, tmp_path: Path) -> None:
    none = Tokenizer(_folder(llama_dir, tmp_path / "none", {"chat_template": None}))
    assert none.chat_template is None
    with pytest.raises(UnsupportedModelError, match="no chat template"):
        none.apply_chat_template(MESSAGES[0])
    named = Tokenizer(_folder(llama_dir, tmp_path / "named", {"chat_template": [
        {"name": "rag", "template": "a"}, {"name": "tool_use", "template": "b"}]}))
    with pytest.raises(UnsupportedModelError, match="none named 'default'"):
        named.apply_chat_template(MESSAGES[0])
    broken = Tokenizer(_folder(llama_dir, tmp_path / "broken", {"chat_template": "{% for %}"}))
    with pytest.raises(UnsupportedModelError, match="does not compile"):
        broken.apply_chat_template(MESSAGES[0])
