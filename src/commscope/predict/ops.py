"""The per-rank emulator: every communication op one training step issues, op by op and rank
by rank (:func:`predict_ops`).

From a model config, a :class:`~commscope.spec.plan.ParallelPlan` (degrees, mapping to
nodes, pipeline schedule and micro-batches, DDP bucket cap, FSDP resharding), the dtype and a few
framework options, :func:`predict_ops` lists every communication op each rank issues in one
*steady-state* step (step >= 2: DDP has rebuilt its buckets and the pipeline has inferred its
shapes), with the same columns as the measured ``ops.parquet`` plus ``traffic`` (tp, pp, dp, ep,
emb). Nothing here touches ``torch.distributed``: a 3B-parameter model on 32 GPUs takes well under
a second, so the model extrapolates to clusters we do not have.

Two frameworks are modelled:

``torch`` (default)
    exactly what commscope's own :class:`~commscope.workload.trainer.Trainer` issues, checked
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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import DTYPE_SIZES, OPS_COLUMNS
from commscope.predict.frameworks import (
    DDP_BUFFER_BUCKET_BYTES,
    bucket_assignment,
    ddp_bucket_bytes,
    deepspeed_buffers,
    fsdp_units,
)
from commscope.predict.options import PredictOptions
from commscope.predict.roles import RoleOps, build_roles
from commscope.predict.schedule import schedule_actions
from commscope.predict.shapes import Param, gpt_params, grad_ready_order, moe_params, vision_model
from commscope.spec.models import VISION_KINDS, expert_capacity, is_moe_block, model_config
from commscope.spec.plan import ParallelPlan, split_layers, validate_cell

TRAFFIC_TYPES = ("tp", "pp", "dp", "ep", "emb")
# Element type of the MoE per-expert token counts (torch.bincount) and of the CE statistics.
INT64_BYTES = 8
FP32_BYTES = 4
# Element type of the training dtype by its size (bf16 shows as float16: same bytes).
DTYPE_NAMES = {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}

# The predicted ops table: the ops table's columns a prediction knows (contracts.OPS_COLUMNS),
# and its own: the traffic type, micro-batch and pipeline stage an op belongs to. In the order
# predict_cell writes them.
PRED_OWN_COLUMNS: tuple[str, ...] = ("traffic", "microbatch", "stage")
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
if not set(PRED_COLUMNS) - set(PRED_OWN_COLUMNS) <= set(OPS_COLUMNS):
    raise AssertionError(f"{PRED_COLUMNS}: not contracts.OPS_COLUMNS and {PRED_OWN_COLUMNS}")


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


class _DenseGptRank:
    """One rank of a dense GPT under a dp x tp x pp plan, emulated in named steps.

    The constructor lays the rank out (its groups, pipeline chunks and data-parallel mode);
    :meth:`run_schedule` then issues each chunk's forward and backward in schedule order,
    :meth:`sync_tied_embeddings` the first/last stage embedding all-reduce and
    :meth:`sync_gradients` the data-parallel gradient traffic after the backward.
    """

    def __init__(self, ctx: _Ctx, rank: int) -> None:
        plan, cfg, opts = ctx.plan, ctx.cfg, ctx.opts
        self.ctx, self.plan, self.opts = ctx, plan, opts
        self.pp_rank = plan.coords(rank)["pp"]
        self.tp_group, self.dp_group, self.pp_group = (
            plan.group_of(d, rank) for d in ("tp", "dp", "pp")
        )
        self.pipelined = plan.pp > 1
        stages_per_rank = plan.stages_per_rank if self.pipelined else 1
        self.n_stages = plan.pp * stages_per_rank
        self.microbatches = plan.microbatches if self.pipelined else 1
        self.tokens = cfg.batch // self.microbatches * cfg.seq  # per micro-batch
        self.act_bytes = self.tokens * cfg.hidden * ctx.dtype_bytes
        megatron = opts.framework == "megatron"
        self.vocab_parallel = bool(opts.vocab_parallel) and plan.tp > 1
        stage_ids = (
            [self.pp_rank + k * plan.pp for k in range(stages_per_rank)] if self.pipelined else [0]
        )
        self.chunks = self._chunks(stage_ids)
        self.ops = _Ops(ctx, rank)
        self.dp_mode = _gpt_dp_mode(plan, megatron)
        self.fsdp = (
            {
                s: _Fsdp(self.ops, self.dp_group, ch, plan.reshard_after_forward)
                for s, ch in self.chunks.items()
            }
            if self.dp_mode == "fsdp"
            else {}
        )
        # TP all-reduces per block: forward, the row-parallel outputs (attention projection and
        # fc2); backward, the input grads of the column-parallel q/k/v (fused in Megatron) and fc1.
        self.fwd_tp = 2
        self.bwd_tp = 2 if megatron else 4

    def _chunks(self, stage_ids: Sequence[int]) -> dict[int, _Chunk]:
        """The pipeline stages this rank holds, with their layers and parameters."""
        cfg, tp, last = self.ctx.cfg, self.plan.tp, self.n_stages - 1
        ranges = split_layers(cfg.layers, self.n_stages)
        return {
            s: _Chunk(
                s,
                ranges[s],
                s == 0,
                s == last,
                gpt_params(cfg, ranges[s], s == 0, s == last, tp, self.opts),
            )
            for s in stage_ids
        }

    def _stage_peer(self, stage: int) -> int:
        return self.pp_group[stage % self.plan.pp]

    def _tp_allreduce(self, count: int = 1) -> None:
        for _ in range(count):
            self.ops.coll("allreduce", "tp", self.tp_group, self.act_bytes)

    def forward(self, ch: _Chunk) -> None:
        """One micro-batch through chunk ``ch``: receive, gather, 2 TP all-reduces per block."""
        ops, act = self.ops, self.act_bytes
        if self.pipelined and not ch.first:
            ops.p2p("recv", self.pp_group, self._stage_peer(ch.stage - 1), act)
        f = self.fsdp.get(ch.stage)
        if f:
            f.unshard("")
        if ch.first and self.vocab_parallel:
            self._tp_allreduce()  # VocabParallelEmbedding output
        for i in ch.layers:
            if f:
                f.unshard(f"layers.{i}")
            self._tp_allreduce(self.fwd_tp)
            if f:
                f.after_forward(f"layers.{i}")
        if ch.last and self.vocab_parallel:
            for _ in range(3):  # vocab-parallel cross entropy: max, target logit, sum(exp)
                ops.coll(
                    "allreduce", "tp", self.tp_group, self.tokens * FP32_BYTES, dtype="float32"
                )
        if f:
            f.after_forward("")
        if self.pipelined and not ch.last:
            ops.p2p("send", self.pp_group, self._stage_peer(ch.stage + 1), act)

    def backward(self, ch: _Chunk) -> None:
        """One micro-batch's backward through ``ch`` (blocks in reverse, recomputation first)."""
        ops, act, pipelined = self.ops, self.act_bytes, self.pipelined
        if pipelined and not ch.last:
            ops.p2p("recv", self.pp_group, self._stage_peer(ch.stage + 1), act)
        f = self.fsdp.get(ch.stage)
        order = ["", *(f"layers.{i}" for i in reversed(ch.layers))]
        if pipelined and not ch.last:
            # A stage fed a received gradient does not fire the root's pre-backward hook on its
            # output (measured): the root unit (the embedding) is gathered after the blocks.
            order = [*order[1:], ""]
        if f:
            f.pre_backward(order, 0)
        if ch.last and self.vocab_parallel:
            self._tp_allreduce()  # input grad of the vocab-parallel head
        for i in reversed(ch.layers):
            if f:
                f.pre_backward(order, order.index(f"layers.{i}"))
            self._tp_allreduce(self.fwd_tp if self.opts.recompute else 0)
            self._tp_allreduce(self.bwd_tp)
            if f and not pipelined:
                f.reduce(f"layers.{i}")
        if f and not pipelined:
            f.reduce("")
        if pipelined and not ch.first:
            ops.p2p("send", self.pp_group, self._stage_peer(ch.stage - 1), act)

    def run_schedule(self) -> None:
        """Every forward and backward of the step, in the pipeline schedule's order."""
        ops = self.ops
        if self.pipelined:
            ops.phase = "fwd_bwd"
            for kind, stage, mb in schedule_actions(self.plan, self.pp_rank):
                ops.mb, ops.stage = mb, stage
                (self.forward if kind == "F" else self.backward)(self.chunks[stage])
        else:
            ops.mb, ops.stage = 0, 0
            ops.phase = "fwd"
            self.forward(self.chunks[0])
            ops.phase = "bwd"
            self.backward(self.chunks[0])
        ops.mb, ops.stage = -1, -1

    def sync_tied_embeddings(self) -> None:
        """Tied input/output embeddings over a pipeline: first and last stage all-reduce the
        word embedding's gradient once per step (traffic ``emb``)."""
        if not (self.opts.tied_embeddings and self.pipelined):
            return
        emb_group = [self.pp_group[0], self.pp_group[(self.n_stages - 1) % self.plan.pp]]
        for ch in self.chunks.values():
            if ch.first or ch.last:
                name = "tok_emb.weight" if ch.first else "head.weight"
                numel = next(p.numel for p in ch.params if p.name == name)
                self.ops.coll("allreduce", "emb", emb_group, numel * self.ctx.dtype_bytes)

    def sync_gradients(self) -> None:
        """The data-parallel gradient traffic after the backward, by ``dp_mode``."""
        ops, plan, db, dp_g = self.ops, self.plan, self.ctx.dtype_bytes, self.dp_group
        if self.dp_mode == "ddp":
            params = self.chunks[0].params
            ready = grad_ready_order(params)
            sizes = [params[i].numel * db for i in ready]
            for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb):
                ops.coll("allreduce", "dp", dp_g, b)
        elif self.dp_mode == "replicate":
            # FSDP2-based replicate on each stage's root module: one unit, one all-reduce.
            for ch in self.chunks.values():
                ops.coll("allreduce", "dp", dp_g, sum(p.numel for p in ch.params) * db)
        elif self.dp_mode == "fsdp" and self.pipelined:
            for s, f in self.fsdp.items():
                ops.stage = s
                for unit in f.units:  # perform_reduce_grad walks the states root first
                    f.reduce(unit)
            ops.stage = -1
        elif self.dp_mode == "megatron":
            numels = [p.numel for ch in self.chunks.values() for p in ch.params]
            for n in deepspeed_buffers(numels, self.opts.dp_buffer_elements):
                ops.coll("allreduce", "dp", dp_g, n * db)


def _gpt_dp_mode(plan: ParallelPlan, megatron: bool) -> str:
    """How gradients are synchronised: none, fsdp, megatron (DeepSpeed buffers), replicate
    (FSDP2-based, with TP or PP) or ddp."""
    if plan.dp <= 1:
        return "none"
    if plan.dp_kind == "fsdp":
        return "fsdp"
    if megatron:
        return "megatron"
    return "replicate" if (plan.tp > 1 or plan.pp > 1) else "ddp"


def _gpt_rank(ctx: _Ctx, rank: int) -> tuple[list[tuple], float]:
    """Ops and compute FLOPs of one rank for a dense GPT under any dp x tp x pp plan."""
    gpt = _DenseGptRank(ctx, rank)
    gpt.run_schedule()
    gpt.sync_tied_embeddings()
    gpt.sync_gradients()
    flops = _gpt_flops(
        ctx.cfg,
        gpt.chunks.values(),
        ctx.plan.tp,
        gpt.microbatches,
        gpt.tokens,
        bool(ctx.opts.recompute),
    )
    return gpt.ops.rows, flops


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
        for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb):
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
    for b in ddp_bucket_bytes(sizes, plan.bucket_cap_mb):
        ops.coll("allreduce", "dp", dp_g, b)
    return ops.rows, flops


def resolve_plan(
    model_spec: dict[str, Any], plan_spec: dict[str, Any] | ParallelPlan, world: int
) -> ParallelPlan:
    """The plan with its -1 degree filled; raises ValueError naming every problem."""
    spec = asdict(plan_spec) if isinstance(plan_spec, ParallelPlan) else dict(plan_spec)
    problems = validate_cell(model_spec, spec, world)
    if problems:
        raise ValueError("cannot predict this cell:\n  - " + "\n  - ".join(problems))
    return ParallelPlan.from_dict(spec).resolve(world)


def predict_step(
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any] | ParallelPlan,
    nodes: int,
    ranks_per_node: int,
    dtype_bytes: int = 4,
    options: PredictOptions | None = None,
    backend: str = DEFAULT_BACKEND,
) -> RoleOps:
    """Every communication op of one steady-state step, held one template per role
    (:mod:`commscope.predict.roles`): :meth:`~commscope.predict.roles.RoleOps.frame` is
    :func:`predict_ops`' table, and its traffic, matrices and summaries come without building
    that table (what ``commscope predict`` does at thousands of GPUs)."""
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
    meta = {
        "kind": kind,
        "plan": asdict(plan),
        "options": asdict(o),
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "dtype_bytes": dtype_bytes,
        "microbatches": plan.microbatches if plan.pp > 1 else 1,
        "flops": {},  # per rank, filled by each table (its ranks only)
        "backend": backend,
    }
    return build_roles(plan, world, ranks_per_node, lambda r: gen(ctx, r), PRED_COLUMNS, meta)


def predict_ops(
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any] | ParallelPlan,
    nodes: int,
    ranks_per_node: int,
    dtype_bytes: int = 4,
    options: PredictOptions | None = None,
    ranks: Iterable[int] | None = None,
    backend: str = DEFAULT_BACKEND,
) -> pd.DataFrame:
    """Every communication op of one steady-state training step, one row per op and rank.

    Columns (units as in docs/traces.md): rank, node, local_rank, seq (issue order on the
    rank), phase, op, traffic (tp/pp/dp/ep/emb), group_ranks, group_size, peer, root, dtype,
    numel, bytes (what the rank contributes: the all-gather shard, the full reduce-scatter
    input, the sent or received tensor), bytes_out, microbatch and stage (-1 outside the
    schedule). ``ranks`` limits the rows to those ranks. ``pred.attrs["predict"]`` keeps what
    :mod:`commscope.predict.timing` needs: the plan, micro-batches and FLOPs per rank, and the
    ``backend`` whose algorithms put the ops on the wire (NCCL for GPU clusters; ``gloo`` for
    the CPU cells measured here), which the sent bytes and matrices of a prediction follow.
    One rank per role is emulated and relabelled onto the others (:func:`predict_step`).
    """
    step = predict_step(model_spec, plan_spec, nodes, ranks_per_node, dtype_bytes, options, backend)
    return step.frame(ranks)
