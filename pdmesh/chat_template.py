"""A model folder's chat template, found and rendered as ``transformers`` does.

Where it lives: ``chat_template.jinja`` (what ``save_pretrained`` writes today, taking
precedence), named ones in ``additional_chat_templates/*.jinja``, or ``chat_template`` in
``tokenizer_config.json`` (one string, or a list of ``{name, template}``). Without tools,
the one used is the single template or the one named ``default``.

How it renders: a sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``,
loop controls (``{% break %}``), and the helpers templates on the Hub call:
``raise_exception`` (a template refusing a conversation, e.g. roles that do not
alternate), ``strftime_now`` and a ``tojson`` that leaves non-ASCII text alone. The named
special tokens (``bos_token``, ``eos_token`` ...) are passed as their text. A template
that refuses the messages is the caller's error (``InvalidRequestError`` on
``messages``), not the server's.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pdmesh.errors import InvalidRequestError, UnsupportedModelError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens ``transformers`` hands every template as text."""


def token_text(value: Any) -> str | None:
    """A special token's text, whether the config spells it as a string or as a saved
    ``AddedToken`` (``{"content": ..., "lstrip": ...}``)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def find_templates(path: Path, config: dict[str, Any]) -> dict[str, str]:
    """Every chat template of the folder by name (the unnamed one as ``default``); the
    files take precedence over ``tokenizer_config.json``, as in ``transformers``."""
    found: dict[str, str] = {}
    if (path / TEMPLATE_FILE).is_file():
        found["default"] = (path / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (path / TEMPLATE_DIR).is_dir():
        for file in sorted((path / TEMPLATE_DIR).glob("*.jinja")):
            found[file.stem] = file.read_text(encoding="utf-8")
    if found:
        return found
    entry = config.get("chat_template")
    if isinstance(entry, str):
        return {"default": entry}
    if isinstance(entry, list):
        return {t["name"]: t["template"] for t in entry if isinstance(t, dict) and "name" in t and "template" in t}
    return {}


class ChatTemplate:
    """The folder's default chat template, compiled once."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        templates = find_templates(path, config)
        self.source: str | None = templates.get("default")
        if self.source is None and len(templates) == 1:
            self.source = next(iter(templates.values()))
        self._path, self._names = path, sorted(templates)
        self._specials = {name: text for name in SPECIAL_TOKENS if (text := token_text(config.get(name)))}
        self._compiled: Any = None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        import jinja2

        if self.source is None:
            raise UnsupportedModelError(
                f"{self._path} has chat templates named {self._names} and none named 'default'" if self._names
                else f"{self._path} has no chat template ({TEMPLATE_FILE} or chat_template in tokenizer_config.json)")
        if self._compiled is None:
            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.TemplateSyntaxError as e:
                raise UnsupportedModelError(f"the model's chat template does not compile: {e}") from e
        try:
            # tools and documents are passed (None when absent) as transformers passes them: a
            # template may test ``tools is defined`` and must take the same branch here.
            return self._compiled.render(messages=messages, tools=tools or None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self._specials)
        except jinja2.TemplateError as e:  # raise_exception, or a message the template cannot read
            raise InvalidRequestError("messages", f"the model's chat template refused them: {e}") from e


def _environment() -> Any:
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
