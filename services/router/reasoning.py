"""A reasoning model's thinking split from its answer (``--reasoning-parser``): the text
in ``<think>...</think>`` goes to the message's ``reasoning_content``, the rest is the
answer (``content``, and what tool-call parsing and structured outputs apply to).

- ``deepseek_r1``: the chat template opens ``<think>`` in the prompt, so the output is
  thinking until ``</think>`` (a ``<think>`` the model writes again is dropped); an output
  that never closes it is all thinking.
- ``qwen3``: thinking only when the output opens with ``<think>`` (the template may have
  turned thinking off, writing an empty block into the prompt).

Streamed text is split as it comes; a piece that may be the start of a marker is held
until the next one tells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OPEN, CLOSE = "<think>", "</think>"
ReasoningParser = Literal["deepseek_r1", "qwen3"]


def thinking_of(parser: ReasoningParser) -> Literal["required", "optional"]:
    """How a structured output's grammar lets the thinking come first: deepseek_r1's block
    is open from the prompt (required), qwen3's is opened by the model or not at all."""
    return "required" if parser == "deepseek_r1" else "optional"


@dataclass
class ReasoningSplit:
    parser: ReasoningParser
    _state: Literal["start", "thinking", "answer"] = "start"
    _held: str = ""

    def feed(self, text: str) -> tuple[str, str]:
        """``(reasoning, content)`` to send now."""
        if self._state == "answer":
            return "", text
        self._held += text
        if self._state == "start":
            lead = self._held.lstrip()
            if len(lead) < len(OPEN) and OPEN.startswith(lead):
                return "", ""  # may still open a block
            if lead.startswith(OPEN):
                self._held = lead[len(OPEN):]
            elif self.parser == "qwen3":
                self._state = "answer"
                out, self._held = self._held, ""
                return "", out
            self._state = "thinking"
        at = self._held.find(CLOSE)
        if at >= 0:
            reasoning, content = self._held[:at], self._held[at + len(CLOSE):]
            self._held, self._state = "", "answer"
            return reasoning, content
        keep = max((k for k in range(1, len(CLOSE)) if self._held.endswith(CLOSE[:k])), default=0)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(out):]
        return out, ""

    def finish(self) -> tuple[str, str]:
        """What is held when the choice ends."""
        held, self._held = self._held, ""
        if self._state == "start":
            return ("", held) if self.parser == "qwen3" else (held.lstrip().removeprefix(OPEN), "")
        return (held, "") if self._state == "thinking" else ("", held)
