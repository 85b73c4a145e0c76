"""What a chat request's ``tools`` and ``tool_choice`` mean for its generation, and one
choice's text turned into content and ``tool_calls``.

- ``none``: the tools reach the template, nothing is read as a call.
- a named function: the output is held by a grammar to the function's parameter schema
  and is that call's arguments, streamed as they are generated.
- ``required``: the output is held to a JSON list of ``{"name", "parameters"}`` objects,
  one per call, each the schema of its tool (one call unless ``parallel_tool_calls``).
- ``auto``: the model writes what it likes; the router's ``--tool-call-parser`` reads
  calls out of it (``parsers.py``), holding back streamed text from a call's marker on.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pdmesh.errors import InvalidRequestError
from pdmesh.structured.spec import StructuredOutput
from services.router.tools.parsers import PARSERS, ParsedCall, ToolParser

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    mode: Mode
    tools: list[dict[str, Any]]
    """The tools as the chat template receives them (OpenAI's shape)."""
    named: str | None = None
    parser: ToolParser | None = None
    structured: StructuredOutput | None = None
    parallel: bool = True
    source: str = "tools"
    """The field an error in ``structured`` is about."""

    @property
    def keeps_special_tokens(self) -> bool:
        return self.parser is not None and self.parser.keeps_special_tokens


def plan(tools: list[Any] | None, tool_choice: Any, parallel: bool, parser_name: str) -> ToolPlan | None:
    """The plan for a request (None: no tools), or ``InvalidRequestError`` naming the field."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice", "names a tool choice but the request has no tools")
        return None
    specs = [t.model_dump(exclude_none=True) for t in tools]
    names = [t.function.name for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InvalidRequestError("tools", f"two tools are named {dup!r}; names must be unique")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan("none", specs)
    if choice == "auto":
        if not parser_name:
            raise InvalidRequestError("tool_choice", "auto needs the router started with --tool-call-parser "
                                      f"(one of {sorted(PARSERS)}, the format the model was trained on); "
                                      "or ask for 'required', a named function, or 'none'")
        return ToolPlan("auto", specs, parser=PARSERS[parser_name](), parallel=parallel)
    if choice == "required":
        return ToolPlan("required", specs, structured=StructuredOutput.of_schema(_calls_schema(tools, parallel)),
                        parallel=parallel)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise InvalidRequestError("tool_choice", 'must be "none", "auto", "required" or {"type": "function", '
                                      '"function": {"name": ...}}')
        if name not in names:
            raise InvalidRequestError("tool_choice.function.name", f"{name!r} is not one of the tools "
                                      f"({', '.join(names)})")
        tool = tools[names.index(name)]
        return ToolPlan("named", specs, named=name, structured=StructuredOutput.of_schema(_parameters(tool)),
                        source=f"tools[{names.index(name)}].function.parameters")
    raise InvalidRequestError("tool_choice", f'must be "none", "auto", "required" or a named function, '
                              f"got {choice!r}")


def _parameters(tool: Any) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _calls_schema(tools: list[Any], parallel: bool) -> dict[str, Any]:
    one = [{"type": "object", "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t)},
            "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def call_json(index: int, call: ParsedCall, call_id: str) -> dict[str, Any]:
    return {"index": index, "id": call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallStream:
    """One choice's generated text split into content and tool calls, as it streams."""

    plan: ToolPlan
    calls: list[dict[str, Any]] = field(default_factory=list)
    """The calls found, in the API's shape (for the whole response)."""
    _pending: str = ""
    _held: str | None = None
    _decided: bool = False
    _named_id: str = ""

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Content to send now and tool-call deltas to send now."""
        mode = self.plan.mode
        if mode == "none" or not text:
            return text, []
        if mode == "named":
            if not self._named_id:
                self._named_id = new_call_id()
                self.calls.append(call_json(0, ParsedCall(self.plan.named or "", ""), self._named_id))
                self.calls[0]["function"]["arguments"] += text
                return "", [dict(self.calls[0], function=dict(self.calls[0]["function"]))]
            self.calls[0]["function"]["arguments"] += text
            return "", [{"index": 0, "function": {"arguments": text}}]
        if mode == "required" or self._held is not None:
            self._held = (self._held or "") + text
            return "", []
        return self._scan(text), []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left when the choice ends: content and the calls not yet sent."""
        mode = self.plan.mode
        if mode in ("none", "named"):
            return "", []
        if mode == "required":
            found = _required_calls(self._held or "")
            if found is None:
                return self._held or "", []
            return "", self._record(found)
        if self._held is None:
            rest, self._pending = self._pending, ""
            return rest, []
        assert self.plan.parser is not None
        parsed = self.plan.parser.parse(self._held)
        if parsed is None or not parsed[1]:
            return self._held, []
        content, found = parsed
        return content, self._record(found)

    def _record(self, found: list[ParsedCall]) -> list[dict[str, Any]]:
        if not self.plan.parallel:
            found = found[:1]
        deltas = [call_json(i, c, new_call_id()) for i, c in enumerate(found)]
        self.calls.extend(deltas)
        return deltas

    def _scan(self, text: str) -> str:
        """Auto mode: pass text through until a call's marker, holding back what may be
        the start of one."""
        parser = self.plan.parser
        assert parser is not None
        if self._decided:
            return text
        self._pending += text
        if parser.at_start:
            lead = self._pending.lstrip()
            if not lead:
                return ""
            if any(lead.startswith(m) for m in parser.markers):
                self._held, self._pending = self._pending, ""
                return ""
            if any(m.startswith(lead) for m in parser.markers):
                return ""
            self._decided = True
            out, self._pending = self._pending, ""
            return out
        at = min((i for m in parser.markers if (i := self._pending.find(m)) >= 0), default=-1)
        if at >= 0:
            out, self._held, self._pending = self._pending[:at], self._pending[at:], ""
            return out
        keep = max((k for m in parser.markers for k in range(1, len(m)) if self._pending.endswith(m[:k])),
                   default=0)
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out


def _required_calls(text: str) -> list[ParsedCall] | None:
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        calls.append(ParsedCall(item["name"], json.dumps(item.get("parameters", {}), ensure_ascii=False)))
    return calls
