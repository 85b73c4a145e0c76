"""Paged attention on CUDA with flashinfer, over the same KV pool as every other backend.

The pool stays ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]`` (one block
is one contiguous NIXL descriptor across all layers); a layer's slice
``[num_blocks, 2, block_size, kv_heads, head_dim]`` is flashinfer's NHD paged layout with
a page stride of ``num_layers`` pages, which its kernels read from the tensor's strides.
A step is planned once, by its first layer (``AttentionMetadata.attn_plan``), from the host
page index the model runner built (``paged_index.py``); every other layer reuses the
plan. Decode rows and prefill chunks, with or without a cached prefix, are one batch of
one kernel: flashinfer's batch prefill with a causal mask aligned to each sequence's
last token, which for a one-row sequence is plain decode attention.

The flashinfer release is pinned in the ``gpu`` extra (pyproject.toml) and in
``deploy/Dockerfile.cuda``; its kernels compile with nvcc on first use, or load from
``flashinfer/data/aot`` where they were built ahead (``scripts/gpu_prebuild.sh``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.paged_index import PagedIndex
from pdmesh.attention.torch_backend import write_kv_slots
from pdmesh.errors import InvalidRequestError

FLASHINFER_PIN = "flashinfer-python==0.6.18.post1"
"""The release pdmesh is tested with (pyproject's ``gpu`` extra says the same)."""
WORKSPACE_BYTES = 256 << 20
"""flashinfer's float workspace (split-KV partial results): twice the 128 MiB its docs
advise, for 128 rows of 4k-token contexts split many ways."""
HALF_DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)
"""Head sizes flashinfer's batch prefill kernels are instantiated for."""


def import_flashinfer() -> ModuleType:
    """flashinfer, or an error that says what to install."""
    try:
        import flashinfer
    except ImportError as exc:
        raise InvalidRequestError(
            "attention_backend",
            f"'flashinfer' needs the flashinfer package, which is not importable ({exc}); "
            f"install it with pip install 'pdmesh[gpu]' ({FLASHINFER_PIN}) or choose 'torch'",
        ) from exc
    return flashinfer


class FlashInferBackend:
    """``AttentionBackend`` over flashinfer's batch prefill kernel (decode rows included)."""

    attends_sampled_rows = False
    """The last layer computes every row: its sampling rows alone would need a second plan
    per step (host time the GPU waits for); whether that pays on a GPU is not measured."""
    wants_paged_index = True
    """The model runner builds ``AttentionMetadata.paged`` for this backend."""

    def __init__(self, device: str | torch.device, dtype: torch.dtype, head_dim: int,
                 variants: tuple[str, ...] = ()) -> None:
        dev = torch.device(device)
        if variants:  # flashinfer plans them (window_left, logits_soft_cap); pdmesh does not yet, per layer
            raise InvalidRequestError(
                "attention_backend",
                f"'flashinfer' in pdmesh plans full attention only, and this model's layers use "
                f"{' and '.join(variants)}; use --attention-backend torch",
            )
        if dev.type != "cuda":
            raise InvalidRequestError("attention_backend", f"'flashinfer' runs on CUDA devices, not {dev}")
        if dtype not in HALF_DTYPES:
            raise InvalidRequestError(
                "attention_backend",
                f"'flashinfer' computes in bfloat16 or float16, not {dtype}; use --dtype bfloat16 "
                "or --attention-backend torch",
            )
        if head_dim not in HEAD_DIMS:
            raise InvalidRequestError(
                "attention_backend",
                f"'flashinfer' computes head_dim {HEAD_DIMS}, not this model's {head_dim}; "
                "use --attention-backend torch",
            )
        self._flashinfer = import_flashinfer()
        self.device = dev
        self.kernels: ModuleType | None = None
        """No CPU kernels: the model runs its norms and rotary embedding in torch ops."""
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        """Shared by every wrapper of this engine (they never run at once)."""
        self._eager = self.new_wrapper()

    def new_wrapper(self, graph_buffers: dict[str, torch.Tensor] | None = None) -> Any:
        """A batch-prefill wrapper on this backend's workspace; with ``graph_buffers``
        (``qo_indptr_buf``, ``paged_kv_indptr_buf``, ``paged_kv_indices_buf``,
        ``paged_kv_last_page_len_buf``), one a CUDA graph can replay."""
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=graph_buffers is not None, backend="fa2",
            **(graph_buffers or {}),
        )

    def write_kv(
        self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        write_kv_slots(kv_layer, k, v, meta)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if window is not None or softcap is not None or sinks is not None:
            raise RuntimeError("the flashinfer backend was built for a model of full, uncapped attention")
        wrapper = meta.attn_plan
        if wrapper is None:  # the step's first layer plans for all of them
            if meta.paged is None:
                raise RuntimeError("the flashinfer backend needs the step's page index (AttentionMetadata.paged)")
            wrapper = meta.attn_plan = self._eager
            plan(wrapper, meta.paged, q.shape[1], kv_layer, scale)
        return wrapper.run(q, kv_layer)


def plan(wrapper: Any, paged: PagedIndex, num_qo_heads: int, kv_layer: torch.Tensor, scale: float) -> None:
    """Plan ``wrapper`` for one step over a layer's slice of the pool (any layer: they share
    shapes). Host work only: flashinfer copies the index to the device itself."""
    _, _, block_size, kv_heads, head_dim = kv_layer.shape
    wrapper.plan(
        paged.qo_indptr, paged.kv_indptr, paged.kv_indices, paged.last_page_len,
        num_qo_heads, kv_heads, head_dim, block_size,
        causal=True, sm_scale=scale, q_data_type=kv_layer.dtype, kv_data_type=kv_layer.dtype,
    )
