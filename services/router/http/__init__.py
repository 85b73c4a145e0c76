"""The router's OpenAI-compatible HTTP front: same process, same event loop, same routing."""
