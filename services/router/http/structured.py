"""Which structured output an OpenAI body asks for, from whichever field spells it.

Three spellings reach the same ``StructuredOutput``: OpenAI's ``response_format``
(``json_object``, or ``json_schema`` with ``name``, ``schema`` and ``strict``), vLLM's
``structured_outputs`` (``json``, ``json_object``, ``regex``, ``choice``, ``grammar``) and
vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``.
A body may use one; an error names the field the caller wrote, not ours.

``strict`` is accepted either way: the output is always held to the schema (a grammar
forbids every token that would leave it), which is what ``strict: true`` promises.
"""

from __future__ import annotations

from typing import Any

from pdmesh.errors import InvalidRequestError
from pdmesh.structured.spec import FIELD, StructuredOutput

_GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_STRUCTURED_KEYS = {"json": "json_schema", "json_object": "json_object", "regex": "regex", "choice": "choice",
                    "grammar": "grammar"}


def requested(body: Any) -> tuple[StructuredOutput | None, str]:
    """The body's structured output (None: free text) and the field it came from."""
    given = [name for name in ("response_format", "structured_outputs", *_GUIDED)
             if _asks(name, getattr(body, name, None))]
    if not given:
        return None, ""
    if len(given) > 1:
        raise InvalidRequestError(given[1], f"set one way of constraining the output, not both {given[0]} "
                                  f"and {given[1]}")
    name = given[0]
    value = getattr(body, name)
    try:
        if name == "response_format":
            return _response_format(value), name
        if name == "structured_outputs":
            return _structured_outputs(value), name
        return _spec(_GUIDED[name], value), name
    except InvalidRequestError as exc:
        raise renamed(exc, name) from None


def renamed(exc: InvalidRequestError, source: str) -> InvalidRequestError:
    """``exc`` with our ``structured_output.KIND`` field named as the body wrote it."""
    if exc.field != FIELD and not exc.field.startswith(FIELD + "."):
        return exc
    kind = exc.field.removeprefix(FIELD).lstrip(".")
    if source == "structured_outputs":
        users = {v: k for k, v in _STRUCTURED_KEYS.items()}
        field = f"{source}.{users[kind]}" if kind in users else source
    elif source == "response_format" and kind == "json_schema":
        field = "response_format.json_schema.schema"
    else:
        field = source
    return InvalidRequestError(field, exc.message)


def _asks(name: str, value: Any) -> bool:
    if value is None:
        return False
    if name == "response_format":
        return not (isinstance(value, dict) and value.get("type") == "text")
    return True


def _response_format(value: dict[str, Any]) -> StructuredOutput:
    kind = value.get("type")
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict):
            raise InvalidRequestError("response_format.json_schema", "must be an object with name and schema")
        if "schema" not in inner:
            raise InvalidRequestError("response_format.json_schema.schema", "is required: the JSON schema the "
                                      "output must match")
        return _spec("json_schema", inner["schema"])
    raise InvalidRequestError("response_format.type", f"must be 'text', 'json_object' or 'json_schema', "
                              f"got {kind!r}")


def _structured_outputs(value: dict[str, Any]) -> StructuredOutput:
    unknown = sorted(set(value) - set(_STRUCTURED_KEYS))
    if unknown:
        raise InvalidRequestError(f"structured_outputs.{unknown[0]}", f"is not supported; use one of "
                                  f"{sorted(_STRUCTURED_KEYS)}")
    set_ = {k: v for k, v in value.items() if v is not None and v is not False}
    if len(set_) != 1:
        raise InvalidRequestError("structured_outputs", f"set exactly one of {sorted(_STRUCTURED_KEYS)}, "
                                  f"got {sorted(set_) or 'none'}")
    (key, v), = set_.items()
    return _spec(_STRUCTURED_KEYS[key], v)


def _spec(kind: str, value: Any) -> StructuredOutput:
    if kind == "json_schema":
        if isinstance(value, str):
            return StructuredOutput(json_schema=value)
        return StructuredOutput.of_schema(value)
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "choice":
        if not isinstance(value, list):
            raise InvalidRequestError(f"{FIELD}.choice", "must be a list of strings")
        return StructuredOutput(choice=tuple(value))
    if not isinstance(value, str):
        raise InvalidRequestError(f"{FIELD}.{kind}", f"must be a string, got {type(value).__name__}")
    return StructuredOutput(regex=value) if kind == "regex" else StructuredOutput(grammar=value)
