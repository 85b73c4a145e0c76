"""What a request's output must match: a JSON schema, any JSON object, a regex, one of a
few strings, or a grammar.

One of the five is set (vLLM's ``structured_outputs`` names them the same way). This is
only the request's description of the constraint, checked for shape here; whether the
schema, regex or grammar compiles is decided by ``pdmesh/structured/grammars.py`` (in the
router before routing, so a bad one is refused before any worker sees it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdmesh.errors import InvalidRequestError

Thinking = Literal["", "required", "optional"]

MAX_SPEC_CHARS = 256 * 1024
"""The largest schema, regex or grammar one request may carry (compiling one is work for
every worker it reaches)."""
MAX_CHOICES = 1024
FIELD = "structured_output"


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    json_schema: str | None = None
    """A JSON schema, as JSON text (kept as text: it is the cache key of its grammar)."""
    json_object: bool = False
    """Any JSON object (OpenAI's JSON mode)."""
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect), or GBNF as llama.cpp writes it."""
    thinking: Thinking = ""
    """A reasoning model's ``...</think>`` comes before the constrained answer: free text
    through the first ``</think>`` (required, or optional), then the constraint. Set by the
    router's reasoning parser: the constraint is on the answer, not the thinking."""

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [k for k in ("json_schema", "regex", "choice", "grammar") if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise InvalidRequestError(FIELD, "set exactly one of json_schema, json_object, regex, choice "
                                      f"and grammar, got {kinds or 'none'}")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except ValueError as e:
                raise InvalidRequestError(f"{FIELD}.json_schema", f"is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(f"{FIELD}.json_schema", "must be a JSON object (a schema)")
        for name in ("json_schema", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(f"{FIELD}.{name}", f"must be a string, got {type(value).__name__}")
            if value is not None and len(value) > MAX_SPEC_CHARS:
                raise InvalidRequestError(f"{FIELD}.{name}", f"at most {MAX_SPEC_CHARS} characters, "
                                          f"got {len(value)}")
        if self.thinking not in ("", "required", "optional"):
            raise InvalidRequestError(f"{FIELD}.thinking", f"must be '', 'required' or 'optional', "
                                      f"got {self.thinking!r}")
        if self.choice is not None:
            if not self.choice or len(self.choice) > MAX_CHOICES:
                raise InvalidRequestError(f"{FIELD}.choice", f"must list 1 to {MAX_CHOICES} strings, "
                                          f"got {len(self.choice)}")
            if not all(isinstance(c, str) and c for c in self.choice):
                raise InvalidRequestError(f"{FIELD}.choice", "every choice must be a non-empty string")
            if sum(map(len, self.choice)) > MAX_SPEC_CHARS:
                raise InvalidRequestError(f"{FIELD}.choice", f"at most {MAX_SPEC_CHARS} characters in all")

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(k for k in ("json_schema", "regex", "choice", "grammar") if getattr(self, k) is not None)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> StructuredOutput:
        """From user-supplied options (a Python caller's dict), naming an unknown one."""
        known = ("json_schema", "json_object", "regex", "choice", "grammar", "thinking")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InvalidRequestError(f"{FIELD}.{unknown[0]}", f"unknown; known are {list(known)}")
        options = dict(options)
        if isinstance(options.get("json_schema"), (dict, bool)):
            return cls.of_schema(options["json_schema"])
        return cls(**options)

    @classmethod
    def of_schema(cls, schema: Any) -> StructuredOutput:
        """From a schema given as an object (HTTP bodies), in a canonical text form so two
        requests with the same schema share one compiled grammar."""
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError(f"{FIELD}.json_schema", "must be a JSON object (a schema)")
        return cls(json_schema=json.dumps(schema, sort_keys=True, separators=(",", ":")))
