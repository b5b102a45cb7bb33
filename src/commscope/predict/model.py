"""Analytical model of the communication one training step issues, op by op and rank by rank.

From a model config, a :class:`~commscope.workload.strategies.ParallelPlan` (degrees, mapping to
nodes, pipeline schedule and micro-batches, DDP bucket cap, FSDP resharding), the dtype and a few
framework options, :func:`predict_ops` lists every communication op each rank issues in one
*steady-state* step (step >= 2: DDP has rebuilt its buckets and the pipeline has inferred its
shapes), with the same columns as the measured ``ops.parquet`` plus ``traffic`` (tp, pp, dp, ep,
emb). Nothing here touches ``torch.distributed``: a 3B-parameter model on 32 GPUs takes well under
a second, so the model extrapolates to clusters we do not have.

Two frameworks are modelled:

``torch`` (default)
    exactly what commscope's own :class:`~commscope.workload.strategies.Trainer` issues, checked
    op for op against gloo traces: DDP buckets as PyTorch packs them, FSDP2 units, DTensor TP with
    separate q/k/v projections (4 backward all-reduces per block), ``torch.distributed.pipelining``
    P2P, the FSDP2-based ``replicate`` in hybrids, MoE all-to-alls.
``megatron``
    Megatron-LM/DeepSpeed PTD-P as in seed 002 §5: fused QKV (2 backward all-reduces per block),
    activation recomputation (+2 per block), vocabulary-parallel embedding, head and cross
    entropy, tied input/output embeddings synchronised between the first and last stage, and one
    gradient all-reduce per DeepSpeed buffer (500M elements) after the backward pass.

Seed 002's Eq. 2-4 are the special case ``megatron`` with the layers divisible by p and the
embedding/head traffic left out; :mod:`commscope.predict` keeps the split Megatron/DeepSpeed use
for remainders (the first stages take one layer more, as ``split_layers`` does), so the first
stage's rank 0 carries more TP and DP traffic than ``l/p`` suggests.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd

from commscope.workload.models import split_layers
from commscope.workload.strategies import VISION_KINDS, ParallelPlan, model_config

TRAFFIC_TYPES = ("tp", "pp", "dp", "ep", "emb")
FRAMEWORKS = ("torch", "megatron")
MIB = 1024 * 1024
# DeepSpeed's PipelineEngine all-reduces gradients in buffers of this many elements
# (deepspeed.runtime.engine.MEMORY_OPT_ALLREDUCE_SIZE), closing a buffer once it exceeds it.
DEEPSPEED_ALLREDUCE_ELEMENTS = 500_000_000
# Megatron pads the vocabulary to a multiple of this times the TP degree
# (--make-vocab-size-divisible-by), so vocab-parallel shards are equal.
MEGATRON_VOCAB_MULTIPLE = 128
# DDP broadcasts module buffers before every forward in buckets of this size
# (DistributedDataParallel.broadcast_bucket_size).
DDP_BUFFER_BUCKET_BYTES = 250 * MIB
# Element type of the MoE per-expert token counts (torch.bincount) and of the CE statistics.
INT64_BYTES = 8
FP32_BYTES = 4
# Element type of the training dtype by its size (bf16 shows as float16: same bytes).
DTYPE_NAMES = {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}
DTYPE_SIZES = {"int64": 8, "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}

PRED_COLUMNS = [
    "rank",
    "node",
    "local_rank",
    "seq",
    "phase",
    "op",
    "traffic",
    "group_ranks",
    "group_size",
    "peer",
    "root",
    "dtype",
    "numel",
    "bytes",
    "bytes_out",
    "microbatch",
    "stage",
]


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


# ─────────────────────────────────────────────────────────── parameters of the models


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
    from commscope.workload.moe import is_moe_block

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


# ─────────────────────────────────────────────────────────── bucketing and sharding rules


def bucket_assignment(
    sizes: Sequence[int], limits: Sequence[int], keys: Sequence[Any] | None = None
) -> list[list[int]]:
    """``c10d::compute_bucket_assignment_by_size`` for tensors given in bucketing order.

    Tensors fill a bucket per key (dtype, device) until its byte size reaches the current
    limit (``>=``, so the tensor that crosses the limit still joins); the next bucket of that
    key then takes the next limit, the last repeating. Returns tensor indices per bucket, in
    the order buckets are closed, then the open ones in order of first use. This is the
    tensor_indices path (rebuilt buckets are not re-sorted); DDP passes the gradient-ready
    order. Checked against ``torch.distributed._compute_bucket_assignment_by_size``.
    """
    keys = keys if keys is not None else [0] * len(sizes)
    open_: dict[Any, tuple[list[int], int]] = {}
    limit_idx: dict[Any, int] = {}
    closed: list[list[int]] = []
    for i, (size, key) in enumerate(zip(sizes, keys, strict=True)):
        idx, total = open_.get(key, ([], 0))
        idx = [*idx, i]
        total += size
        li = limit_idx.setdefault(key, 0)
        if total >= limits[li]:
            closed.append(idx)
            open_[key] = ([], 0)
            limit_idx[key] = min(li + 1, len(limits) - 1)
        else:
            open_[key] = (idx, total)
    return closed + [idx for idx, _ in open_.values() if idx]


def ddp_bucket_bytes(
    param_bytes_ready_order: Sequence[int], bucket_cap_mb: float, first_bucket_mb: float | None
) -> list[int]:
    """Bytes of each DDP bucket all-reduce in the steady state (after the rebuild).

    ``bucket_cap_mb`` becomes ``int(cap * 2**20)`` bytes as in ``_BucketCapacityConfig``. The
    first bucket is capped at ``first_bucket_mb`` only when DDP is built without an explicit
    ``bucket_cap_mb`` (then 1 MiB, ``dist._DEFAULT_FIRST_BUCKET_BYTES``); commscope always
    passes the plan's cap, so ``None`` here: every bucket takes the same cap.
    """
    cap = int(bucket_cap_mb * MIB)
    first = cap if first_bucket_mb is None else int(first_bucket_mb * MIB)
    buckets = bucket_assignment(param_bytes_ready_order, [first, cap])
    return [sum(param_bytes_ready_order[i] for i in b) for b in buckets]


def deepspeed_buffers(numels: Sequence[int], limit: int) -> list[int]:
    """Elements per DeepSpeed gradient all-reduce (``allreduce_no_retain``): a buffer is sent
    as soon as its element count *exceeds* ``limit``, the rest at the end."""
    out, acc = [], 0
    for n in numels:
        acc += n
        if acc > limit:
            out.append(acc)
            acc = 0
    if acc:
        out.append(acc)
    return out


def fsdp_units(params: Sequence[Param], dp: int) -> dict[str, int]:
    """FSDP2 unit -> elements of this rank's (padded) shard, in forward order (root first)."""
    units: dict[str, int] = {"": 0}
    for p in params:
        units[p.unit] = units.get(p.unit, 0) + p.fsdp_shard_numel(dp)
    if not units[""]:
        del units[""]
    return units


# ─────────────────────────────────────────────────────────── pipeline schedules


def schedule_actions(plan: ParallelPlan, pp_rank: int) -> list[tuple[str, int, int]]:
    """``("F"|"B", stage, microbatch)`` in the order ``torch.distributed.pipelining`` runs
    them on pipeline rank ``pp_rank`` (GPipe: all forwards, then all backwards; 1F1B: warm-up
    of ``stages - stage`` forwards as Schedule1F1B; interleaved: ``_get_1f1b_rank_ops``)."""
    m, p, v = plan.microbatches, plan.pp, plan.stages_per_rank
    if plan.pp_schedule == "gpipe":
        return [("F", pp_rank, i) for i in range(m)] + [("B", pp_rank, i) for i in range(m)]
    if plan.pp_schedule == "1f1b":
        warm = min(m, p - pp_rank)
        out = [("F", pp_rank, i) for i in range(warm)]
        fwd, bwd = warm, 0
        while bwd < m:
            out.append(("B", pp_rank, bwd))
            bwd += 1
            if fwd < m:
                out.append(("F", pp_rank, fwd))
                fwd += 1
        return out
    # Interleaved 1F1B, torch's ScheduleInterleaved1F1B._calculate_single_rank_operations.
    rounds = max(1, m // p)
    per_round = m // rounds
    warm = min((v - 1) * per_round + 2 * (p - 1 - pp_rank), m * v)
    total = m * v

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + pp_rank

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * p + pp_rank

    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}
    out = []
    for step in range(warm + (total - warm) + warm):
        if step < total:
            s = fwd_stage(step)
            out.append(("F", s, fwd_mb.setdefault(s, 0)))
            fwd_mb[s] += 1
        if step >= warm:
            s = bwd_stage(step)
            out.append(("B", s, bwd_mb.setdefault(s, 0)))
            bwd_mb[s] += 1
    return out


# ─────────────────────────────────────────────────────────── the per-rank op generator


@dataclass
class _Ctx:
    kind: str
    cfg: Any
    plan: ParallelPlan
    opts: PredictOptions
    nodes: int
    rpn: int
    dtype_bytes: int

    @property
    def world(self) -> int:
        return self.nodes * self.rpn


class _Ops:
    """Rows of one rank, appended in issue order."""

    def __init__(self, ctx: _Ctx, rank: int) -> None:
        self.ctx, self.rank = ctx, rank
        self.rows: list[tuple] = []
        self.phase = "fwd"
        self.mb = -1
        self.stage = -1

    def coll(
        self,
        op: str,
        traffic: str,
        group: Sequence[int],
        nbytes: int,
        out: int | None = None,
        dtype: str | None = None,
        root: int = -1,
    ) -> None:
        if len(group) <= 1 or nbytes <= 0:
            return
        self._add(op, traffic, group, -1, root, nbytes, nbytes if out is None else out, dtype)

    def p2p(self, op: str, group: Sequence[int], peer: int, nbytes: int) -> None:
        self._add(op, "pp", group, peer, -1, nbytes, nbytes, None)

    def _add(
        self,
        op: str,
        traffic: str,
        group: Sequence[int],
        peer: int,
        root: int,
        nbytes: int,
        out: int,
        dtype: str | None,
    ) -> None:
        dtype = dtype or DTYPE_NAMES.get(self.ctx.dtype_bytes, f"{self.ctx.dtype_bytes}B")
        elem = DTYPE_SIZES.get(dtype, self.ctx.dtype_bytes)
        rpn = self.ctx.rpn
        self.rows.append(
            (
                self.rank,
                self.rank // rpn,
                self.rank % rpn,
                len(self.rows),
                self.phase,
                op,
                traffic,
                ",".join(map(str, group)),
                len(group),
                peer,
                root,
                dtype,
                nbytes // elem,
                int(nbytes),
                int(out),
                self.mb,
                self.stage,
            )
        )


@dataclass
class _Chunk:
    """One pipeline stage held by this rank (the whole model when pp == 1)."""

    stage: int
    layers: range
    first: bool
    last: bool
    params: list[Param]


class _Fsdp:
    """FSDP2 per-unit state machine of one chunk, as torch 2.13 runs it (measured):
    all-gather when a sharded unit runs forward or backward; reshard after forward when
    ``reshard_after_forward`` (the root too: commscope passes it explicitly, and torch only
    keeps the root unsharded when the argument is left at None); reduce-scatter and reshard
    after backward, except inside a pipeline schedule, which defers both to one
    ``perform_reduce_grad`` per step."""

    def __init__(self, ops: _Ops, group: Sequence[int], chunk: _Chunk, raf: bool) -> None:
        self.ops, self.group, self.raf = ops, list(group), raf
        self.units = fsdp_units(chunk.params, len(group))
        self.sharded = dict.fromkeys(self.units, True)

    def _bytes(self, unit: str) -> int:
        return self.units[unit] * self.ops.ctx.dtype_bytes

    def pre_backward(self, order: Sequence[str], j: int) -> None:
        """Unit ``order[j]`` starts its backward: all-gather it if needed, then prefetch the
        next unit in backward order (FSDP2's implicit backward prefetch), which is why the
        all-gather of block i-1 precedes the reduce-scatter of block i."""
        present = [u for u in order if u in self.units]
        if order[j] not in self.units:
            return
        k = present.index(order[j])
        self.unshard(present[k])
        if k + 1 < len(present):
            self.unshard(present[k + 1])

    def unshard(self, unit: str) -> None:
        if unit in self.units and self.sharded[unit]:
            b = self._bytes(unit)
            self.ops.coll("allgather", "dp", self.group, b, b * len(self.group))
            self.sharded[unit] = False

    def after_forward(self, unit: str) -> None:
        if unit in self.units and self.raf:
            self.sharded[unit] = True

    def reduce(self, unit: str, reshard: bool = True) -> None:
        if unit in self.units:
            b = self._bytes(unit)
            self.ops.coll("reduce_scatter", "dp", self.group, b * len(self.group), b)
            if reshard:
                self.sharded[unit] = True


def _gpt_rank(ctx: _Ctx, rank: int) -> tuple[list[tuple], float]:
    """Ops and compute FLOPs of one rank for a dense GPT under any dp x tp x pp plan."""
    plan, cfg, o, db = ctx.plan, ctx.cfg, ctx.opts, ctx.dtype_bytes
    c = plan.coords(rank)
    tp_g, dp_g, pp_g = (plan.group_of(d, rank) for d in ("tp", "dp", "pp"))
    t, pipelined = plan.tp, plan.pp > 1
    v = plan.stages_per_rank if pipelined else 1
    n_stages = plan.pp * v
    ranges = split_layers(cfg.layers, n_stages)
    m = plan.microbatches if pipelined else 1
    tokens = cfg.batch // m * cfg.seq  # per micro-batch
    act = tokens * cfg.hidden * db
    megatron = o.framework == "megatron"
    vp = bool(o.vocab_parallel) and t > 1
    stage_ids = [c["pp"] + k * plan.pp for k in range(v)] if pipelined else [0]
    chunks = {
        s: _Chunk(
            s,
            ranges[s],
            s == 0,
            s == n_stages - 1,
            gpt_params(cfg, ranges[s], s == 0, s == n_stages - 1, t, o),
        )
        for s in stage_ids
    }
    ops = _Ops(ctx, rank)
    dp_mode = "none"
    if plan.dp > 1:
        if plan.dp_kind == "fsdp":
            dp_mode = "fsdp"
        elif megatron:
            dp_mode = "megatron"
        else:
            dp_mode = "replicate" if (t > 1 or pipelined) else "ddp"
    fsdp = (
        {s: _Fsdp(ops, dp_g, ch, plan.reshard_after_forward) for s, ch in chunks.items()}
        if dp_mode == "fsdp"
        else {}
    )
    fwd_tp = 2  # row-parallel outputs: attention projection and fc2
    bwd_tp = 2 if megatron else 4  # input grads of the column-parallel q/k/v (fused) and fc1

    def stage_peer(stage: int) -> int:
        return pp_g[stage % plan.pp]

    def forward(ch: _Chunk) -> None:
        if pipelined and not ch.first:
            ops.p2p("recv", pp_g, stage_peer(ch.stage - 1), act)
        f = fsdp.get(ch.stage)
        if f:
            f.unshard("")
        if ch.first and vp:
            ops.coll("allreduce", "tp", tp_g, act)  # VocabParallelEmbedding output
        for i in ch.layers:
            if f:
                f.unshard(f"layers.{i}")
            for _ in range(fwd_tp):
                ops.coll("allreduce", "tp", tp_g, act)
            if f:
                f.after_forward(f"layers.{i}")
        if ch.last and vp:
            for _ in range(3):  # vocab-parallel cross entropy: max, target logit, sum(exp)
                ops.coll("allreduce", "tp", tp_g, tokens * FP32_BYTES, dtype="float32")
        if f:
            f.after_forward("")
        if pipelined and not ch.last:
            ops.p2p("send", pp_g, stage_peer(ch.stage + 1), act)

    def backward(ch: _Chunk) -> None:
        if pipelined and not ch.last:
            ops.p2p("recv", pp_g, stage_peer(ch.stage + 1), act)
        f = fsdp.get(ch.stage)
        order = ["", *(f"layers.{i}" for i in reversed(ch.layers))]
        if pipelined and not ch.last:
            # A stage fed a received gradient does not fire the root's pre-backward hook on its
            # output (measured): the root unit (the embedding) is gathered after the blocks.
            order = [*order[1:], ""]
        if f:
            f.pre_backward(order, 0)
        if ch.last and vp:
            ops.coll("allreduce", "tp", tp_g, act)  # input grad of the vocab-parallel head
        for i in reversed(ch.layers):
            if f:
                f.pre_backward(order, order.index(f"layers.{i}"))
            for _ in range(fwd_tp if o.recompute else 0):
                ops.coll("allreduce", "tp", tp_g, act)
            for _ in range(bwd_tp):
                ops.coll("allreduce", "tp", tp_g, act)
            if f and not pipelined:
                f.reduce(f"layers.{i}")
        if f and not pipelined:
            f.reduce("")
        if pipelined and not ch.first:
            ops.p2p("send", pp_g, stage_peer(ch.stage - 1), act)

    if pipelined:
        ops.phase = "fwd_bwd"
        for kind, stage, mb in schedule_actions(plan, c["pp"]):
            ops.mb, ops.stage = mb, stage
            (forward if kind == "F" else backward)(chunks[stage])
    else:
        ops.mb, ops.stage = 0, 0
        ops.phase = "fwd"
        forward(chunks[0])
        ops.phase = "bwd"
        backward(chunks[0])
    ops.mb, ops.stage = -1, -1

    if o.tied_embeddings and pipelined:
        emb_group = [pp_g[0], pp_g[(n_stages - 1) % plan.pp]]
        for ch in chunks.values():
            if ch.first or ch.last:
                name = "tok_emb.weight" if ch.first else "head.weight"
                numel = next(p.numel for p in ch.params if p.name == name)
                ops.coll("allreduce", "emb", emb_group, numel * db)
    if dp_mode == "ddp":
        params = chunks[0].params
        ready = grad_ready_order(params)
        sizes = [params[i].numel * db for i in ready]
        for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb, None):
            ops.coll("allreduce", "dp", dp_g, b)
    elif dp_mode == "replicate":
        # FSDP2-based replicate on each stage's root module: one unit, one all-reduce.
        for ch in chunks.values():
            ops.coll("allreduce", "dp", dp_g, sum(p.numel for p in ch.params) * db)
    elif dp_mode == "fsdp" and pipelined:
        for s, f in fsdp.items():
            ops.stage = s
            for unit in f.units:  # perform_reduce_grad walks the states root first
                f.reduce(unit)
        ops.stage = -1
    elif dp_mode == "megatron":
        numels = [p.numel for ch in chunks.values() for p in ch.params]
        for n in deepspeed_buffers(numels, o.dp_buffer_elements):
            ops.coll("allreduce", "dp", dp_g, n * db)
    return ops.rows, _gpt_flops(cfg, chunks.values(), t, m, tokens, bool(o.recompute))


def _gpt_flops(
    cfg: Any, chunks: Iterable[_Chunk], tp: int, m: int, tokens: int, rec: bool
) -> float:
    """Compute FLOPs of one rank per step (Appendix C's counting, per stage and TP rank).

    Forward per token and block: 2 x (4h^2 + 2 f h^2) for the projections and MLP plus 4 s h for
    the attention scores and the weighted sum; the head 2 h V. Backward costs twice the forward,
    recomputation once more for the blocks; the TP rank does 1/t of the blocks and its share of
    the head (all of it when the head is replicated). For the whole model with f = 4 and
    recomputation this is Eq. 11: 96 b s l h^2 (1 + s/6h + V/16lh).
    """
    h, f, s = cfg.hidden, cfg.ffn_mult, cfg.seq
    per_block = 2 * (4 + 2 * f) * h * h + 4 * s * h
    total = 0.0
    for ch in chunks:
        blocks = len(ch.layers) * per_block * (4 if rec else 3) / tp
        head = 0.0
        if ch.last:
            names = ("head.weight", "tok_emb.weight")  # a tied head multiplies by the embedding
            rows = next(p.shape[0] for n in names for p in ch.params if p.name == n)
            head = 3 * 2 * h * rows
        total += (blocks + head) * tokens * m
    return total


def _moe_rank(ctx: _Ctx, rank: int) -> tuple[list[tuple], float]:
    """MoE GPT with data and expert parallelism: per MoE layer 3 all-to-alls forward (per-expert
    counts, tokens, combine) and 2 backward, then DDP over the dense parameters (all of them when
    ep == 1). Token all-to-alls assume balanced routing: every expert gets ``tokens * top_k /
    experts`` assignments, capped at its capacity; the measured ones vary with the router."""
    from commscope.workload.moe import expert_capacity, is_moe_block

    plan, cfg, db = ctx.plan, ctx.cfg, ctx.dtype_bytes
    ops = _Ops(ctx, rank)
    ep_g = plan.group_of("ep", rank)
    tokens = cfg.batch * cfg.seq
    kept = min(tokens * cfg.top_k, cfg.experts * expert_capacity(cfg, tokens))
    moe_layers = [i for i in range(cfg.layers) if is_moe_block(cfg, i)]
    ops.mb, ops.stage = 0, 0
    ops.phase = "fwd"
    if plan.ep > 1:
        for _ in moe_layers:
            ops.coll("alltoall", "ep", ep_g, cfg.experts * INT64_BYTES, dtype="int64")
            ops.coll("alltoall", "ep", ep_g, kept * cfg.hidden * db)
            ops.coll("alltoall", "ep", ep_g, kept * cfg.hidden * db)
    ops.phase = "bwd"
    if plan.ep > 1:
        for _ in moe_layers:
            ops.coll("alltoall", "ep", ep_g, kept * cfg.hidden * db)
            ops.coll("alltoall", "ep", ep_g, kept * cfg.hidden * db)
    params = moe_params(cfg, plan.ep, plan.coords(rank)["ep"])
    if plan.ep > 1:
        params = [p for p in params if not p.expert]  # experts live on one rank: not DDP'd
    group = plan.group_of("dp", rank) if plan.ep == 1 else list(range(ctx.world))
    if ctx.world > 1:
        ready = grad_ready_order(params)
        sizes = [params[i].numel * db for i in ready]
        for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb, None):
            ops.coll("allreduce", "dp", group, b)
    h, f, s = cfg.hidden, cfg.ffn_mult, cfg.seq
    # Forward FLOPs per token: attention as in _gpt_flops; an MoE MLP runs top_k experts
    # plus the router, a dense one its own MLP.
    dense = 2 * 4 * h * h + 4 * s * h
    moe_mlp = 2 * cfg.top_k * 2 * f * h * h + 2 * h * cfg.experts
    per_tok = sum(
        dense + (moe_mlp if i in moe_layers else 4 * f * h * h) for i in range(cfg.layers)
    )
    return ops.rows, 3 * (per_tok + 2 * h * cfg.vocab) * tokens


def _vision_rank(ctx: _Ctx, rank: int) -> tuple[list[tuple], float]:
    """ResNet-50/VGG16 under DDP (buffer broadcast before each forward, gradient buckets in
    autograd's ready order) or FSDP2 (one unit per top-level child with parameters + root)."""
    plan, cfg, db = ctx.plan, ctx.cfg, ctx.dtype_bytes
    vm = vision_model(cfg.arch, cfg.num_classes, cfg.image)
    ops = _Ops(ctx, rank)
    dp_g = plan.group_of("dp", rank)
    flops = vm.flops_per_sample * cfg.batch
    if plan.dp <= 1:
        return ops.rows, flops
    ops.mb, ops.stage = 0, 0
    params = list(vm.params)
    if plan.dp_kind == "fsdp":
        chunk = _Chunk(0, range(0), True, True, params)
        f = _Fsdp(ops, dp_g, chunk, plan.reshard_after_forward)
        children = [u for u in f.units if u]
        ops.phase = "fwd"
        f.unshard("")
        for u in children:
            f.unshard(u)
            f.after_forward(u)
        f.after_forward("")
        ops.phase = "bwd"
        order = ["", *reversed(children)]
        for j, u in enumerate(order):
            f.pre_backward(order, j)
            if u:
                f.reduce(u)
        f.reduce("")
        return ops.rows, flops
    ops.phase = "fwd"
    # _broadcast_coalesced: buckets per dtype (tensor order), <= 250 MiB, one broadcast each.
    sizes = [n * DTYPE_SIZES[d] for _, n, d in vm.buffers]
    keys = [d for _, _, d in vm.buffers]
    buckets = bucket_assignment(sizes, [DDP_BUFFER_BUCKET_BYTES], keys)
    buckets.sort(key=min)  # comm.cpp sorts buckets by their first tensor (no tensor_indices)
    for b in buckets:
        total = sum(sizes[i] for i in b)
        ops.coll("broadcast", "dp", dp_g, total, dtype=keys[b[0]], root=dp_g[0])
    ops.phase = "bwd"
    sizes = [params[i].numel * db for i in vm.ready]
    for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb, None):
        ops.coll("allreduce", "dp", dp_g, b)
    return ops.rows, flops


# ─────────────────────────────────────────────────────────── public API


def resolve_plan(
    model_spec: dict[str, Any], plan_spec: dict[str, Any] | ParallelPlan, world: int
) -> ParallelPlan:
    """The plan with its -1 degree filled; raises ValueError naming every problem."""
    from commscope.workload.strategies import validate_cell

    spec = asdict(plan_spec) if isinstance(plan_spec, ParallelPlan) else dict(plan_spec)
    problems = validate_cell(model_spec, spec, world)
    if problems:
        raise ValueError("cannot predict this cell:\n  - " + "\n  - ".join(problems))
    return ParallelPlan.from_dict(spec).resolve(world)


def predict_ops(
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any] | ParallelPlan,
    nodes: int,
    ranks_per_node: int,
    dtype_bytes: int = 4,
    options: PredictOptions | None = None,
    ranks: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Every communication op of one steady-state training step, one row per op and rank.

    Columns (units as in docs/traces.md): rank, node, local_rank, seq (issue order on the
    rank), phase, op, traffic (tp/pp/dp/ep/emb), group_ranks, group_size, peer, root, dtype,
    numel, bytes (what the rank contributes: the all-gather shard, the full reduce-scatter
    input, the sent or received tensor), bytes_out, microbatch and stage (-1 outside the
    schedule). ``ranks`` limits the rows to those ranks. ``pred.attrs["predict"]`` keeps what
    :mod:`commscope.predict.timing` needs: the plan, micro-batches and FLOPs per rank.
    """
    o = (options or PredictOptions()).resolve()
    kind = model_spec.get("kind", "gpt")
    world = nodes * ranks_per_node
    plan = resolve_plan(model_spec, plan_spec, world)
    cfg = model_config(model_spec)
    if o.framework == "megatron" and kind != "gpt":
        raise ValueError("framework megatron models GPT under PTD-P only (model kind gpt)")
    ctx = _Ctx(kind, cfg, plan, o, nodes, ranks_per_node, dtype_bytes)
    gen: Callable[[_Ctx, int], tuple[list[tuple], float]] = (
        _vision_rank if kind in VISION_KINDS else _moe_rank if kind == "moe" else _gpt_rank
    )
    wanted = sorted(set(ranks)) if ranks is not None else range(world)
    rows: list[tuple] = []
    flops: dict[int, float] = {}
    for r in wanted:
        r_rows, flops[r] = gen(ctx, r)
        rows += r_rows
    pred = pd.DataFrame(rows, columns=PRED_COLUMNS)
    pred.attrs["predict"] = {
        "kind": kind,
        "plan": asdict(plan),
        "options": asdict(o),
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "dtype_bytes": dtype_bytes,
        "microbatches": plan.microbatches if plan.pp > 1 else 1,
        "flops": flops,
    }
    return pred


def traffic_of(
    ops: pd.DataFrame, model_spec: dict[str, Any], plan_spec: dict[str, Any], world: int
) -> pd.Series:
    """Traffic type of measured ops (e.g. ``ops.parquet``) from their op and group.

    send/recv: pp; alltoall: ep; a collective on the rank's TP or DP group: tp/dp; on the pair
    (first stage, last stage): emb; MoE's DDP over every rank: dp; anything else: "other".
    """
    plan = resolve_plan(model_spec, plan_spec, world)
    moe = model_spec.get("kind", "gpt") == "moe"
    cache: dict[tuple[int, str, str], str] = {}

    def kind(rank: int, op: str, group: str) -> str:
        key = (rank, op, group)
        if key not in cache:
            members = [int(x) for x in str(group).split(",") if x != ""]
            pp_g = plan.group_of("pp", rank)
            out = "other"
            if op in ("send", "recv"):
                out = "pp"
            elif op == "alltoall":
                out = "ep"
            elif len(members) > 1 and plan.pp > 1 and members == [pp_g[0], pp_g[-1]]:
                out = "emb"
            elif plan.tp > 1 and members == plan.group_of("tp", rank):
                out = "tp"
            elif (plan.dp > 1 and members == plan.group_of("dp", rank)) or (
                moe and members == list(range(world))
            ):
                out = "dp"
            cache[key] = out
        return cache[key]

    return pd.Series(
        [
            kind(int(r), o, g)
            for r, o, g in zip(ops["rank"], ops["op"], ops["group_ranks"], strict=True)
        ],
        index=ops.index,
        name="traffic",
    )


def compare_measured(
    pred: pd.DataFrame,
    measured: pd.DataFrame,
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any],
    warmup_steps: int = 2,
) -> pd.DataFrame:
    """Predicted vs measured bytes and message counts per rank, traffic type and steady step.

    ``measured`` is an ops table (one cell); steps below ``warmup_steps`` and set-up ops
    (step -1) are left out. ``match`` is True where bytes and counts agree exactly,
    ``sizes_match`` where the message sizes agree one by one (as sorted lists).
    """
    world = int(pred.attrs["predict"]["nodes"]) * int(pred.attrs["predict"]["ranks_per_node"])
    meas = measured[measured["step"] >= warmup_steps].copy()
    meas["traffic"] = traffic_of(meas, model_spec, plan_spec, world)

    def sizes(b: pd.Series) -> tuple[int, ...]:
        return tuple(sorted(int(x) for x in b))

    got = (
        meas.groupby(["rank", "step", "traffic"])["bytes"]
        .agg(measured_bytes="sum", measured_msgs="size", measured_sizes=sizes)
        .reset_index()
    )
    want = (
        pred.groupby(["rank", "traffic"])["bytes"]
        .agg(predicted_bytes="sum", predicted_msgs="size", predicted_sizes=sizes)
        .reset_index()
    )
    steps = pd.DataFrame({"step": sorted(meas["step"].unique())})
    out = want.merge(steps, how="cross").merge(got, on=["rank", "step", "traffic"], how="outer")
    for col in ("predicted_bytes", "predicted_msgs", "measured_bytes", "measured_msgs"):
        out[col] = out[col].fillna(0).astype("int64")
    for col in ("predicted_sizes", "measured_sizes"):
        out[col] = [v if isinstance(v, tuple) else () for v in out[col]]
    out["match"] = (out["predicted_bytes"] == out["measured_bytes"]) & (
        out["predicted_msgs"] == out["measured_msgs"]
    )
    # Stronger than the totals: the same multiset of message sizes (bucket by bucket).
    out["sizes_match"] = out["predicted_sizes"] == out["measured_sizes"]
    out = out.drop(columns=["predicted_sizes", "measured_sizes"])
    return out.sort_values(["rank", "step", "traffic"]).reset_index(drop=True)


def _sizes_text(sizes: pd.Series) -> str:
    counts = sizes.value_counts().sort_index(ascending=False)
    return "; ".join(f"{int(s)}x{int(n)}" for s, n in counts.items())


def _sent_bytes(pred: pd.DataFrame) -> pd.Series:
    """Ring-model bytes each row's rank transmits (metrics.op_destinations, summed)."""
    from commscope.metrics import op_destinations

    keys = ["op", "bytes", "group_ranks", "rank", "peer", "root"]
    uniq = pred[keys].drop_duplicates()
    sent = {
        tuple(k): sum(b for _, b in op_destinations(*k))
        for k in uniq.itertuples(index=False, name=None)
    }
    return pd.Series(
        [sent[k] for k in pred[keys].itertuples(index=False, name=None)], index=pred.index
    )


def summarize(pred: pd.DataFrame) -> pd.DataFrame:
    """Per rank and traffic type: ``bytes`` (payload, summed as in the ops table), ``sent_bytes``
    (what the rank puts on the wire under the ring model), ``messages``, smallest/mean/largest
    message, and ``sizes`` ("bytes x count; ..." largest first)."""
    df = pred.assign(sent_bytes=_sent_bytes(pred))
    g = df.groupby(["rank", "node", "traffic"])
    out = g.agg(
        bytes=("bytes", "sum"),
        sent_bytes=("sent_bytes", "sum"),
        messages=("bytes", "size"),
        msg_min=("bytes", "min"),
        msg_mean=("bytes", "mean"),
        msg_max=("bytes", "max"),
    )
    out["sizes"] = g["bytes"].apply(_sizes_text)
    return out.reset_index()


def rank_matrix(pred: pd.DataFrame) -> pd.DataFrame:
    """Rank x rank bytes per step by traffic type (sparse: src_rank, dst_rank, src_node,
    dst_node, traffic, bytes), from the ring model of :func:`commscope.metrics.op_destinations`:
    all-reduce 2(n-1)/n S to the ring successor, all-gather (n-1) x shard, reduce-scatter
    (n-1)/n S, all-to-all S/n to every other member, send S to the peer."""
    from commscope.metrics import op_destinations

    rpn = int(pred.attrs.get("predict", {}).get("ranks_per_node", 0)) or None
    keys = ["op", "bytes", "group_ranks", "rank", "peer", "root", "traffic"]
    counted = pred.groupby(keys).size().reset_index(name="count")
    rows = []
    for op, nbytes, group, rank, peer, root, traffic, count in counted.itertuples(
        index=False, name=None
    ):
        for dst, b in op_destinations(op, nbytes, group, rank, peer, root):
            rows.append((rank, dst, traffic, b * count))
    mat = pd.DataFrame(rows, columns=["src_rank", "dst_rank", "traffic", "bytes"])
    mat = mat.groupby(["src_rank", "dst_rank", "traffic"], as_index=False)["bytes"].sum()
    node_of = pred.drop_duplicates("rank").set_index("rank")["node"]
    if rpn:
        mat["src_node"] = mat["src_rank"] // rpn
        mat["dst_node"] = mat["dst_rank"] // rpn
    else:
        mat["src_node"] = mat["src_rank"].map(node_of)
        mat["dst_node"] = mat["dst_rank"].map(node_of)
    return mat[["src_rank", "dst_rank", "src_node", "dst_node", "traffic", "bytes"]]


def node_matrix(pred: pd.DataFrame, by_traffic: bool = False) -> pd.DataFrame:
    """Node x node bytes per step (complete grid; the diagonal is traffic inside a node)."""
    mat = rank_matrix(pred)
    meta = pred.attrs.get("predict", {})
    nodes = int(meta.get("nodes", 0)) or int(pred["node"].max()) + 1
    keys = ["src_node", "dst_node", *(["traffic"] if by_traffic else [])]
    levels = [range(nodes), range(nodes)]
    if by_traffic:
        levels.append(sorted(mat["traffic"].unique()))
    grid = pd.MultiIndex.from_product(levels, names=keys)
    return mat.groupby(keys)["bytes"].sum().reindex(grid, fill_value=0.0).reset_index()
