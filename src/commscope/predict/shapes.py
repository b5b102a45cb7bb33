"""Parameter inventories of the models as one rank holds them: :class:`Param`, GPT (per stage
and TP rank, Megatron's vocabulary padding), MoE GPT (per EP rank) and the vision models (read
off the real module on the meta device), and the order autograd readies their gradients."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from commscope.predict.options import PredictOptions
from commscope.spec.models import is_moe_block


@dataclass(frozen=True)
class Param:
    """One parameter as a rank holds it: ``shape`` after TP sharding, before FSDP sharding.

    ``unit`` is the FSDP unit it belongs to (the module ``fully_shard`` wraps, "" = the root);
    ``kind`` the owning module's type, which fixes the order autograd readies its gradients.
    """

    name: str
    shape: tuple[int, ...]
    unit: str = ""
    kind: str = "linear"
    expert: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def fsdp_shard_numel(self, dp: int) -> int:
        """Elements of this rank's FSDP2 shard: dim 0 chunked like ``torch.chunk`` and padded
        to the first (largest) chunk, which is what FSDP2 all-gathers and reduce-scatters."""
        rest = self.numel // self.shape[0] if self.shape[0] else 0
        return -(-self.shape[0] // dp) * rest


def padded_vocab(vocab: int, tp: int, multiple: int) -> int:
    """Megatron's vocabulary padding: the next multiple of ``multiple * tp``."""
    step = max(multiple, 1) * tp if multiple > 1 else 1
    return -(-vocab // step) * step


def _linear(
    prefix: str, out_f: int, in_f: int, split: str | None, tp: int, unit: str
) -> list[Param]:
    """nn.Linear's (weight, bias) as one TP rank holds them (colwise: rows, rowwise: columns;
    a rowwise bias is replicated)."""
    if split == "col":
        w, b = (out_f // tp, in_f), (out_f // tp,)
    elif split == "row":
        w, b = (out_f, in_f // tp), (out_f,)
    else:
        w, b = (out_f, in_f), (out_f,)
    return [Param(f"{prefix}.weight", w, unit), Param(f"{prefix}.bias", b, unit)]


def _norm(prefix: str, hidden: int, unit: str) -> list[Param]:
    return [
        Param(f"{prefix}.weight", (hidden,), unit, "norm"),
        Param(f"{prefix}.bias", (hidden,), unit, "norm"),
    ]


def _block_params(
    cfg: Any, i: int, tp: int, moe: bool = False, experts: Iterable[int] | None = None
) -> list[Param]:
    """Block ``i`` in registration order (models.Block, or moe.MoEBlock with the router and
    the ``experts`` this rank holds, all of them by default)."""
    h, f = cfg.hidden, cfg.ffn_mult * cfg.hidden
    col, row = ("col", "row") if tp > 1 else (None, None)
    p = unit = f"layers.{i}"
    out = _norm(f"{p}.ln1", h, unit)
    for name in ("q", "k", "v"):
        out += _linear(f"{p}.attn.{name}", h, h, col, tp, unit)
    out += _linear(f"{p}.attn.proj", h, h, row, tp, unit)
    out += _norm(f"{p}.ln2", h, unit)
    if not moe:
        return (
            out
            + _linear(f"{p}.mlp.fc1", f, h, col, tp, unit)
            + _linear(f"{p}.mlp.fc2", h, f, row, tp, unit)
        )
    out.append(Param(f"{p}.mlp.router.weight", (cfg.experts, h), unit))
    for e in experts if experts is not None else range(cfg.experts):
        mlp = _linear(f"{p}.mlp.experts.{e}.fc1", f, h, None, 1, unit)
        mlp += _linear(f"{p}.mlp.experts.{e}.fc2", h, f, None, 1, unit)
        out += [replace(q, expert=True) for q in mlp]
    return out


def gpt_params(
    cfg: Any,
    layer_ids: Iterable[int],
    has_embedding: bool = True,
    has_head: bool = True,
    tp: int = 1,
    options: PredictOptions | None = None,
) -> list[Param]:
    """Parameters of one GPT (stage) on one TP rank, in ``models.GPT`` registration order.

    Blocks follow the Megatron split of ``strategies.tp_plan`` when ``tp > 1``. The embeddings,
    final norm and head are replicated over TP unless ``vocab_parallel`` splits the vocabulary.
    With ``tied_embeddings`` the head owns no weight on a stage that has the embedding; a last
    stage without it keeps a copy of the word embedding (Megatron's ``word_embeddings`` on the
    last stage).
    """
    o = (options or PredictOptions()).resolve()
    h = cfg.hidden
    v_tp = tp if (o.vocab_parallel and tp > 1) else 1
    vocab = padded_vocab(cfg.vocab, tp, o.vocab_multiple or 1) // v_tp
    out: list[Param] = []
    if has_embedding:
        out.append(Param("tok_emb.weight", (vocab, h), "", "embedding"))
        out.append(Param("pos_emb.weight", (cfg.seq, h), "", "embedding"))
    for i in layer_ids:
        out += _block_params(cfg, i, tp)
    if has_head:
        out += _norm("norm", h, "")
        if not (o.tied_embeddings and has_embedding):
            out.append(Param("head.weight", (vocab, h), "", "linear"))
    return out


def moe_params(cfg: Any, ep: int = 1, ep_rank: int = 0) -> list[Param]:
    """Parameters of ``moe.MoEGPT`` on one EP rank (its ``experts/ep`` experts per MoE layer)."""
    per = cfg.experts // ep
    local = range(ep_rank * per, (ep_rank + 1) * per)
    out = [
        Param("tok_emb.weight", (cfg.vocab, cfg.hidden), "", "embedding"),
        Param("pos_emb.weight", (cfg.seq, cfg.hidden), "", "embedding"),
    ]
    for i in range(cfg.layers):
        out += _block_params(cfg, i, 1, moe=is_moe_block(cfg, i), experts=local)
    out += _norm("norm", cfg.hidden, "")
    out.append(Param("head.weight", (cfg.vocab, cfg.hidden), "", "linear"))
    return out


def grad_ready_order(params: Sequence[Param]) -> list[int]:
    """Indices of ``params`` in the order autograd makes their gradients ready (GPT/MoE).

    Modules finish their backward in reverse registration order. Inside a module the autograd
    engine runs AccumulateGrad nodes as soon as they are ready: a Linear's bias gradient comes out
    of AddmmBackward directly, its weight's only after the transpose node, so (bias, weight); a
    LayerNorm's backward yields (weight, bias) together, in that order. This is the order DDP's
    reducer records in the first iteration and rebuilds its buckets from (checked against
    autograd hooks in the tests).
    """
    modules: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        modules.setdefault(p.name.rsplit(".", 1)[0], []).append(i)
    order: list[int] = []
    for idx in reversed(list(modules.values())):
        order += idx if params[idx[0]].kind == "norm" else list(reversed(idx))
    return order


@dataclass(frozen=True)
class VisionModel:
    """A vision model's parameters (registration order), gradient-ready order, buffers and
    forward+backward FLOPs per sample, read off the real module built on the meta device."""

    params: tuple[Param, ...]
    ready: tuple[int, ...]
    buffers: tuple[tuple[str, int, str], ...]  # (name, numel, dtype)
    flops_per_sample: float


@functools.lru_cache(maxsize=8)
def vision_model(arch: str, num_classes: int, image: int) -> VisionModel:
    """Build ResNet-50/VGG16 on the meta device (no memory, no compute) and run one backward so
    autograd itself gives the gradient-ready order; count FLOPs with FlopCounterMode."""
    # Local: torch (and workload.vision, which needs it) load only when a vision model is
    # predicted, so the predictor of GPT and MoE models stays torch-free.
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from commscope.workload.vision import VisionConfig, build_vision_model

    with torch.device("meta"):
        model = build_vision_model(VisionConfig(arch=arch, num_classes=num_classes))
    kinds = {
        torch.nn.Linear: "linear",
        torch.nn.Conv2d: "conv",
        torch.nn.BatchNorm2d: "norm",
    }
    owner = {}
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            owner[f"{mod_name}.{p_name}" if mod_name else p_name] = kinds.get(type(mod), "other")
    unit_names = [n for n, c in model.named_children() if any(True for _ in c.parameters())]
    params, index = [], {}
    for name, p in model.named_parameters():
        top = name.split(".", 1)[0]
        index[name] = len(params)
        params.append(
            Param(name, tuple(p.shape), top if top in unit_names else "", owner.get(name, "other"))
        )
    ready: list[int] = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, n=name: ready.append(index[n]))
    batch = 2
    x = torch.empty(batch, 3, image, image, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    buffers = tuple(
        (n, b.numel(), str(b.dtype).removeprefix("torch.")) for n, b in model.named_buffers()
    )
    return VisionModel(tuple(params), tuple(ready), buffers, counter.get_total_flops() / batch)
