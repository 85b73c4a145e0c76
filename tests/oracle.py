"""The oracle the tests compare with: transformers on the same weights, the families
make-tiny draws, and prompts of varied lengths."""

from __future__ import annotations

import random
from pathlib import Path

ARCHS = ("llama", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3",
         "deepseek_v3")
"""Every family make-tiny draws: the dense ones, four mixtures of experts, Gemma 2/3
(sliding-window layers) and DeepSeek-V3 (latent attention over a mixture of experts)."""
MOE_ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")


def mixed_prompts(n: int, seed: int = 0, vocab: int = 1000) -> list[list[int]]:
    """Token-id prompts of varied lengths (1 to 150), skipping the special ids 0-4."""
    rng = random.Random(seed)
    lengths = [1, 3, 7, 16, 17, 31, 48, 65, 100, 150]
    return [[rng.randrange(5, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


class HFReference:
    """transformers on the same weights: the oracle for greedy tokens and logprobs."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        ids = self.torch.tensor([prompt])
        # An explicit mask: a tokenizer's BOS may share the pad token's id, which generate()
        # would otherwise mask out.
        out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=max_new_tokens)
        return out[0, len(prompt) :].tolist()

    def logprobs(self, tokens: list[int]):  # type: ignore[no-untyped-def]
        """log_softmax over the vocabulary at every position of ``tokens``."""
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([tokens])).logits[0].float()
        return self.torch.log_softmax(logits, dim=-1)
