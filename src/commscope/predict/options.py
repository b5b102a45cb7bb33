"""What the framework does beyond the parallel plan: :class:`PredictOptions` and the framework
constants it defaults to (torch as commscope's trainer runs it, or Megatron/DeepSpeed PTD-P)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

FRAMEWORKS = ("torch", "megatron")
MIB = 1024 * 1024
# DeepSpeed's PipelineEngine all-reduces gradients in buffers of this many elements
# (deepspeed.runtime.engine.MEMORY_OPT_ALLREDUCE_SIZE), closing a buffer once it exceeds it.
DEEPSPEED_ALLREDUCE_ELEMENTS = 500_000_000
# Megatron pads the vocabulary to a multiple of this times the TP degree
# (--make-vocab-size-divisible-by), so vocab-parallel shards are equal.
MEGATRON_VOCAB_MULTIPLE = 128


@dataclass(frozen=True)
class PredictOptions:
    """What the framework does beyond the plan. ``None`` takes the framework's default.

    ``recompute``: full activation recomputation per transformer block (Megatron default on):
    the backward re-runs each block's forward, adding its 2 TP all-reduces.
    ``vocab_parallel``: token embedding, LM head and cross entropy split over the TP group
    (Megatron): +1 all-reduce of the embedding output (first stage, forward), +1 of the head's
    input gradient (last stage, backward), +3 fp32 all-reduces of ``tokens`` values in the
    cross entropy (max, target logit, sum of exponentials).
    ``tied_embeddings``: the head reuses the token embedding; with pp > 1 the last stage keeps a
    copy whose gradient is all-reduced with the first stage's once per step (traffic ``emb``).
    ``vocab_multiple``: pad the vocabulary to a multiple of ``vocab_multiple * tp``.
    ``dp_buffer_elements``: DeepSpeed's gradient all-reduce buffer (megatron only).
    """

    framework: str = "torch"
    recompute: bool | None = None
    vocab_parallel: bool | None = None
    tied_embeddings: bool | None = None
    vocab_multiple: int | None = None
    dp_buffer_elements: int = DEEPSPEED_ALLREDUCE_ELEMENTS

    def resolve(self) -> PredictOptions:
        """Fill the framework defaults; reject unknown frameworks."""
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework {self.framework!r}: use one of {FRAMEWORKS}")
        megatron = self.framework == "megatron"

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        return replace(
            self,
            recompute=pick(self.recompute, megatron),
            vocab_parallel=pick(self.vocab_parallel, megatron),
            tied_embeddings=pick(self.tied_embeddings, megatron),
            vocab_multiple=pick(self.vocab_multiple, MEGATRON_VOCAB_MULTIPLE if megatron else 1),
        )
