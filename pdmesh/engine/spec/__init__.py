"""Speculative decoding: proposers guess k tokens, the target model verifies them at once.

``ngram`` looks the context's suffix up earlier in the context (no extra model);
``draft`` runs a small model with its own paged KV; ``rejection`` decides which drafts are
kept so that output is exactly what one-token-per-step decoding would produce (greedy) or
has exactly its distribution (sampling); ``speculator`` ties them to the engine step.
"""
