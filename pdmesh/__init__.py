"""pdmesh: an LLM-inference service mesh with disaggregated prefill and decode.

``from pdmesh import LLM, SamplingParams`` is the in-process entry point; the engine behind
it is the one every pdmesh service runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdmesh.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdmesh.engine.llm import LLM

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # LLM pulls in torch; keep `import pdmesh` light for tools that only need hashing.
    if name == "LLM":
        from pdmesh.engine.llm import LLM

        return LLM
    raise AttributeError(name)
