"""Tools around the engine (``pdmesh model make-tiny``); this module stays torch-free so
the CLI can list their choices without loading torch."""

TINY_ARCHS = ("llama", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3",
              "deepseek_v2", "deepseek_v3")
"""The families ``make-tiny`` draws."""
