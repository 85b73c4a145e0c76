"""Incremental detokenization and stop-string detection for one sequence.

Text is produced token by token by decoding a short sliding window (``prefix_offset`` to the
end) and emitting only what the newest token added, and nothing while the window ends in
an incomplete UTF-8 character. Stop strings are searched only in the tail that the new
text could complete, so a stop string spanning several tokens is found once it is whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdmesh.tokenizer import Tokenizer

# Prompt tokens decoded as left context, so the first output token gets its real spacing.
_CONTEXT_TOKENS = 5


@dataclass(slots=True)
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    stop: tuple[str, ...]
    include_stop: bool
    skip_special_tokens: bool
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""

    @classmethod
    def for_prompt(
        cls,
        tokenizer: Tokenizer,
        prompt_ids: list[int],
        stop: tuple[str, ...],
        include_stop: bool,
        skip_special_tokens: bool,
    ) -> IncrementalDetokenizer:
        context = list(prompt_ids[-_CONTEXT_TOKENS:])
        return cls(tokenizer, stop, include_stop, skip_special_tokens, context, 0, len(context))

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; returns the stop string it completed, if any (text is cut there).

        ``check_stop`` is False while ``min_tokens`` has not been reached.
        """
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip)
        full = decode(self.ids[self.prefix_offset :], skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        before = len(self.text)
        self.text += full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return self._check_stop(before) if self.stop and check_stop else None

    def _check_stop(self, before: int) -> str | None:
        longest = max(len(s) for s in self.stop)
        start = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = self.text.find(s, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        at, s = best
        self.text = self.text[: at + len(s)] if self.include_stop else self.text[:at]
        return s
