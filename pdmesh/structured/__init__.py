"""Structured outputs: the spec a request carries, its grammar, the mask it puts on the logits."""
