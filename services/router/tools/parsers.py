"""Reading tool calls out of a model's text (``tool_choice: auto``), one parser per format
models are trained to write; the names are vLLM's ``--tool-call-parser`` names.

Each parser says where calls begin (a marker anywhere in the text, or the text itself
opening as a call) and turns the text from there into calls. Text that only looks like a
call but does not parse stays content: a model that writes ``<tool_call>`` and then prose
has made no call.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str
    """JSON text of the arguments object."""


def _arguments(value: Any) -> str | None:
    if isinstance(value, str):  # some models write the arguments as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def _call_of(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    raw: Any = next((obj[k] for k in args_keys if k in obj), {})
    args = _arguments(raw)
    return ParsedCall(obj["name"], args) if args is not None else None


def _json_values(text: str) -> list[Any] | None:
    """Consecutive JSON values in ``text`` (separated by whitespace, ``;`` or ``,``)."""
    out: list[Any] = []
    dec, i = json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


class ToolParser:
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]
    """Where calls begin: anywhere in the text, or (``at_start``) as its first non-blank text."""
    at_start: ClassVar[bool] = False
    keeps_special_tokens: ClassVar[bool] = False
    """The marker is a special token, so the text must keep special tokens."""

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        """``text`` from the first marker on: the content around the calls and the calls,
        or None when it does not parse (then all of it is content)."""
        raise NotImplementedError


class Hermes(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (Qwen 2.5,
    Hermes, many fine-tunes). An unclosed last block parses when the model stopped at EOS."""

    name = "hermes"
    markers = ("<tool_call>",)
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        calls = []
        for m in self._block.finditer(text):
            values = _json_values(m.group(1))
            if not values or len(values) != 1 or (call := _call_of(values[0])) is None:
                return None
            calls.append(call)
        rest = self._block.sub("", text).strip()
        return rest, calls


class Llama3Json(ToolParser):
    """Llama 3.1+: the reply is a JSON object ``{"name": ..., "parameters": {...}}`` (several
    separated by ``;``), optionally after ``<|python_tag|>``."""

    name = "llama3_json"
    markers = ("<|python_tag|>", "{")
    at_start = True
    keeps_special_tokens = True

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        values = _json_values(text.strip().removeprefix("<|python_tag|>"))
        if not values:
            return None
        calls = [_call_of(v) for v in values]
        return None if None in calls else ("", calls)  # type: ignore[return-value]


class Mistral(ToolParser):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers), or
    ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11+)."""

    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    keeps_special_tokens = True

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        body = text.split("[TOOL_CALLS]")
        calls: list[ParsedCall] = []
        for part in body[1:]:
            part = part.strip()
            if "[ARGS]" in part:
                fn, _, args = part.partition("[ARGS]")
                values = _json_values(args)
                parsed = _arguments(values[0]) if values and len(values) == 1 else None
                if parsed is None or not fn.strip():
                    return None
                calls.append(ParsedCall(fn.strip(), parsed))
                continue
            values = _json_values(part)
            if not values or len(values) != 1 or not isinstance(values[0], list):
                return None
            for item in values[0]:
                if (call := _call_of(item)) is None:
                    return None
                calls.append(call)
        return body[0].strip(), calls


class Pythonic(ToolParser):
    """Llama 3.2 / 4: the reply is a Python list of calls, ``[get_weather(city="Paris")]``,
    with literal arguments only (read with ``ast``, never evaluated)."""

    name = "pythonic"
    markers = ("[",)
    at_start = True

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        try:
            tree = ast.parse(text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>"),
                             mode="eval")
        except SyntaxError:
            return None
        if not isinstance(tree.body, ast.List):
            return None
        calls = []
        for node in tree.body.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                return None
            calls.append(ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        return "", calls


class Qwen3Xml(ToolParser):
    """Qwen3-Coder: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
    </function></tool_call>``; a value that reads as JSON is taken as such, else as text."""

    name = "qwen3_xml"
    markers = ("<tool_call>",)
    _block = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*(?:</tool_call>|$)", re.S)
    _param = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]] | None:
        calls = []
        for m in self._block.finditer(text):
            args: dict[str, Any] = {}
            for p in self._param.finditer(m.group(2)):
                try:
                    args[p.group(1)] = json.loads(p.group(2))
                except ValueError:
                    args[p.group(1)] = p.group(2)
            calls.append(ParsedCall(m.group(1), json.dumps(args, ensure_ascii=False)))
        if not calls:
            return None
        return self._block.sub("", text).strip(), calls


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (Hermes, Llama3Json, Mistral, Pythonic, Qwen3Xml)}
