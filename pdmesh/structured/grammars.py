"""Structured outputs compiled against one tokenizer, with llguidance.

Why llguidance (over xgrammar, the other maintained engine on the package index): on this
project's CPU both compute a token mask in microseconds (small-llama's 8,192-token
vocabulary, a nested JSON schema: llguidance 10-14 us a token, xgrammar 2.8-3.9 us; a decode
step is tens of milliseconds, so neither is visible), but llguidance compiles a grammar
lazily (0.2 ms for that schema, xgrammar 3.1 ms, growing with the vocabulary), follows JSON
Schema's own semantics (extra properties allowed unless ``additionalProperties`` is false;
xgrammar's default forbids them), reads Lark and GBNF grammars and regexes natively, and
installs as one 3 MB wheel with no dependencies (xgrammar pulls in triton and a TVM
runtime). Speculative decoding needs the same of both (consume a draft, roll it back);
``docs/structured-outputs.md`` has the measurement and how to rerun it.

A compiled grammar is a pristine ``LLMatcher`` kept per spec (least recently used first
out); each sequence takes a ``deep_copy`` of it, which costs microseconds. Compiling runs
where the caller is (the router's and the workers' executors, ``AsyncLLMEngine.prepare``),
not on the engine's step thread, which only copies.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pdmesh.errors import InvalidRequestError
from pdmesh.structured.spec import FIELD, StructuredOutput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

log = logging.getLogger(__name__)
MAX_COMPILED = 256
"""Compiled grammars kept per process (each a few kilobytes to a few megabytes)."""
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON as ``json.dumps`` writes it. Flexible whitespace lets a weak or unlucky model pad
an object with newlines until ``max_tokens``; fixed separators keep every output short and
still parse anywhere."""


THINKING = {
    "required": r"THINK: /(?s:.*)<\/think>/ & ~/(?s:.*<\/think>.+)/",
    "optional": r"THINK: /<think>(?s:.*)<\/think>/ & ~/(?s:.*<\/think>.+)/",
}
"""A reasoning model's thinking as one lexeme, through the first ``</think>``: no
extension of it is one, so the lexer commits there and the answer's grammar begins.
Required: the template opened the block, any text up to its end. Optional: the model
opens the block itself with ``<think>`` (no whitespace before it: a weak model could pad
there forever), or answers at once."""


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar (its JSON form, or Lark) for ``spec``."""
    answer = _answer_text(spec)
    if not spec.thinking:
        return answer
    try:
        inner = json.loads(answer)["grammars"]
    except (ValueError, KeyError, TypeError):
        inner = [{"lark_grammar": answer}]
    inner[0] = dict(inner[0], name="answer")
    start = "THINK @answer" if spec.thinking == "required" else "THINK? @answer"
    lark = f"start: {start}\n{THINKING[spec.thinking]}"
    return json.dumps({"grammars": [{"name": "thinking", "lark_grammar": lark}, *inner]})


def _answer_text(spec: StructuredOutput) -> str:
    import llguidance

    build = llguidance.LLMatcher
    if spec.json_schema is not None:
        return build.grammar_from_json_schema(spec.json_schema, defaults=JSON_OPTIONS)
    if spec.json_object:
        return build.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.regex is not None:
        return build.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return build.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    assert spec.grammar is not None
    lark = spec.grammar
    if "::=" in lark:  # GBNF, as llama.cpp and vLLM's EBNF examples write it
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            lark = gbnf_to_lark(lark)
        except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions for syntax errors
            raise InvalidRequestError(f"{FIELD}.grammar", f"is not a valid GBNF grammar: {e}") from None
    return build.grammar_from_lark(lark)


class Grammars:
    """The grammars of one model's tokenizer: compiled once per spec, copied per sequence."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._compiled: OrderedDict[StructuredOutput, Any] = OrderedDict()

    @property
    def tokenizer(self) -> Any:
        """llguidance's view of the tokenizer; built on first use (tens of milliseconds for
        a small vocabulary, about a second for a 200k one)."""
        with self._lock:
            if self._tokenizer is None:
                import llguidance

                self._tokenizer = llguidance.LLTokenizer(self._tokenizer_json, n_vocab=self.vocab_size,
                                                         eos_token=list(self.eos_token_ids) or None)
            return self._tokenizer

    def compile(self, spec: StructuredOutput) -> Any:
        """The pristine matcher of ``spec``; ``InvalidRequestError`` naming the field when
        the schema, regex or grammar does not compile or uses what llguidance lacks."""
        with self._lock:
            hit = self._compiled.get(spec)
            if hit is not None:
                self._compiled.move_to_end(spec)
                return hit
        import llguidance

        text = grammar_text(spec)
        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{FIELD}.{spec.kind}", f"does not compile: {_summary(matcher.get_error())}")
        with self._lock:
            self._compiled[spec] = matcher
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        return matcher

    def matcher(self, spec: StructuredOutput) -> TokenGrammar:
        """A new sequence's state under ``spec`` (compiled here only if no caller did)."""
        return TokenGrammar(self.compile(spec).deep_copy())


class TokenGrammar:
    """One sequence's place in its grammar.

    It follows the sequence's output tokens (``catch_up``) rather than being told of each:
    a sequence whose first token another worker sampled (the hand-off), or that resumes
    another worker's tokens (failover), or that forks from a parent (``n > 1``), reaches
    the right state from its tokens alone, so no grammar state crosses the wire.
    """

    __slots__ = ("matcher", "consumed", "left")

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.consumed = 0
        self.left = False
        """Its tokens left the grammar (said once in the log)."""

    def catch_up(self, output_ids: Sequence[int]) -> None:
        if self.consumed < len(output_ids):
            ok = self.matcher.consume_tokens(list(output_ids[self.consumed:]))
            self.consumed = len(output_ids)
            if not ok and not self.left:  # tokens the grammar never allowed (a resume's), a parser limit
                self.left = True
                log.warning("a sequence left its grammar after %d tokens; it may only end now: %s",
                            len(output_ids), _summary(self.matcher.get_error()))

    def fill_mask(self, row: Any, drafts: Sequence[int] = ()) -> None:
        """Write the allowed next tokens as bits into ``row`` (an int32 CPU tensor of
        ``ceil(vocab / 32)``), as if ``drafts`` had been accepted first (speculative
        verification); the matcher is left where it was."""
        taken = self.matcher.try_consume_tokens(list(drafts)) if drafts else 0
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if taken:
            self.matcher.rollback(taken)


def _summary(error: str, limit: int = 400) -> str:
    """llguidance's message on one line (a regex error spans several), capped."""
    text = " ".join(error.split()) or "unknown error"
    return text if len(text) <= limit else text[: limit - 3] + "..."
