"""``pdmesh bench serve``: the client side of every serving benchmark pdmesh reports.

One command measures pdmesh (over gRPC or its OpenAI HTTP API) and any OpenAI-compatible
peer (vLLM, SGLang ...) the same way: same prompts, same arrivals, same clock.
"""
