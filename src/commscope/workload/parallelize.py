"""Apply a :class:`~commscope.spec.plan.ParallelPlan` to a model, torchtitan style.

:func:`parallelize` is the checklist; each step is one small function over a sub-mesh, called in
this order (the order is part of what the capture measures: it fixes which ops the set-up issues
and how the gradients are bucketed):

1. :func:`build_chunks` — the model, or this rank's pipeline stages, on the device;
2. :func:`apply_tp` — Megatron-style tensor parallelism of every block;
3. :func:`apply_ep` — expert parallelism of the MoE layers;
4. data parallelism, one of :func:`apply_fsdp`, :func:`apply_replicate`, :func:`apply_ddp`;
5. :func:`build_schedule` — the pipeline schedule over the stages.

The ``torch.distributed`` sub-packages (tensor parallel, FSDP, pipelining) are imported inside the
functions that use them, as before this module existed: only runs that need them pay for the
import, and they are imported after ``capture.install()`` registered its kernels, as always.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from commscope.spec.models import VISION_KINDS, ModelConfig
from commscope.spec.plan import ParallelPlan, split_layers
from commscope.workload.models import GPT, lm_loss
from commscope.workload.moe import MoEGPT, apply_expert_parallel
from commscope.workload.vision import build_vision_model

if TYPE_CHECKING:  # annotations only: pipelining itself is imported where used (see above)
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleMulti,
        PipelineScheduleSingle,
    )


@dataclass
class Parallelized:
    """What :func:`parallelize` built on this rank.

    ``modules`` are the (wrapped) model chunks whose parameters the optimizer steps: one, or one
    per pipeline stage of this rank; ``chunks`` the same modules before a DDP wrapper, under
    their own parameter and module names. ``expert_params`` are the MoE experts kept on this rank
    (their gradients need scaling, see ``Trainer``); ``stage_ids``, ``schedule``, ``first`` and
    ``last`` describe the pipeline (pp > 1 only).
    """

    modules: list[nn.Module]
    chunks: list[nn.Module]
    expert_params: list[nn.Parameter] = field(default_factory=list)
    stage_ids: list[int] = field(default_factory=list)
    schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None
    first: bool = True
    last: bool = True


def sub_mesh(mesh: DeviceMesh | None, plan: ParallelPlan, dim: str) -> DeviceMesh | None:
    """The 1-D mesh of ``dim``, or None when the plan does not parallelise along it."""
    return mesh[dim] if mesh is not None and getattr(plan, dim) > 1 else None


def build_chunks(
    kind: str, cfg: ModelConfig, plan: ParallelPlan, pp_rank: int, device: torch.device
) -> list[nn.Module]:
    """This rank's part of the model on ``device``: the whole model, or (GPT with pp > 1) one
    GPT per pipeline stage it runs, each holding a contiguous slice of the layers."""
    if kind in VISION_KINDS:
        return [build_vision_model(cfg).to(device)]
    if kind == "moe":
        return [MoEGPT(cfg).to(device)]
    if plan.pp == 1:
        return [GPT(cfg).to(device)]
    n_stages = plan.n_stages()
    ranges = split_layers(cfg.layers, n_stages)
    return [
        GPT(cfg, ranges[s], has_embedding=s == 0, has_head=s == n_stages - 1).to(device)
        for s in plan.stage_ids(pp_rank)
    ]


def tp_plan(
    sequence_parallel: bool = False, first: bool = False, last: bool = False
) -> dict[str, Any]:
    """Megatron-style split of one block: q/k/v and fc1 column-wise, proj and fc2 row-wise.

    With ``sequence_parallel`` (Megatron-SP) the residual stream between the attention and MLP
    halves is sharded on the sequence dimension: the LayerNorms run on sequence shards, an
    all-gather rebuilds the full sequence before attention and MLP, and their row-wise outputs
    are reduce-scattered instead of all-reduced. The stream is sharded on entering the first
    block (a local slice, no traffic) and gathered on leaving the last.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(),
        }
    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    plan: dict[str, Any] = {
        "ln1": SequenceParallel(),
        "attn": PrepareModuleInput(**gather),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "ln2": SequenceParallel(),
        "mlp": PrepareModuleInput(**gather),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    if first:
        plan[""] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)
        )
    if last:
        plan[""] = PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
        )
    return plan


def apply_tp(chunks: list[nn.Module], tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard every block of every chunk over ``tp_mesh`` with :func:`tp_plan`, in place.

    With sequence parallelism a chunk's first block shards the stream on entry and its last
    gathers it on exit, so the embeddings and the head outside the blocks see the full sequence.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    for chunk in chunks:
        blocks = list(chunk.layers.values())
        for i, block in enumerate(blocks):
            if sequence_parallel and len(blocks) == 1:
                # Enter and leave in the same block: shard on entry, gather on exit.
                parallelize_module(block, tp_mesh, tp_plan(True, first=True))
                parallelize_module(block, tp_mesh, {"": tp_plan(True, last=True)[""]})
                continue
            block_plan = tp_plan(sequence_parallel, first=i == 0, last=i == len(blocks) - 1)
            parallelize_module(block, tp_mesh, block_plan)


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> list[nn.Parameter]:
    """Keep this rank's experts of every MoE layer and route tokens over ``ep_mesh``; returns the
    expert parameters left here, which DDP is told to ignore (it must run after this)."""
    names = apply_expert_parallel(model, ep_mesh.get_group())
    named = dict(model.named_parameters())
    # Experts live on one rank each: DDP must not all-reduce them.
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    return [named[n] for n in names]


def fsdp_units(kind: str, model: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards as units of their own (before the root): every block of a GPT,
    every top-level stage that has parameters of a vision model (ResNet layer1..4, VGG
    features/classifier)."""
    if kind in VISION_KINDS:
        return [child for child in model.children() if any(True for _ in child.parameters())]
    return list(getattr(model, "layers", {}).values())


def apply_fsdp(
    model: nn.Module, dp_mesh: DeviceMesh, units: list[nn.Module], reshard_after_forward: bool
) -> None:
    """FSDP2 over ``dp_mesh``: each unit its own parameter group, then the root (the rest)."""
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def apply_replicate(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    """Replicate over ``dp_mesh`` with the FSDP2-based ``replicate``, as torchtitan does.

    Used where classic DDP cannot go: composed with TP (DTensor parameters DDP cannot bucket) or
    PP (DDP's reducer breaks when a rank runs several stages' backward per step).
    """
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(model, mesh=dp_mesh)


def apply_ddp(
    model: nn.Module, group: dist.ProcessGroup, bucket_cap_mb: float | None
) -> nn.parallel.DistributedDataParallel:
    """Classic DDP over ``group`` (a process group, not a mesh: MoE's dense part is replicated
    over the world group, which is no mesh dimension).

    ``bucket_cap_mb`` None leaves the argument out, as users' jobs do: PyTorch then caps the
    first bucket at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) and the rest at 25 MiB.
    Passing any value, 25 included, caps every bucket at it (``_BucketCapacityConfig``).
    """
    # Only a given cap is passed: passing None explicitly is the same today, but leaving the
    # argument out is what a user's job does, whatever a later torch does with None.
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    return nn.parallel.DistributedDataParallel(model, process_group=group, **kwargs)


def data_parallel(
    kind: str, model: nn.Module, plan: ParallelPlan, mesh: DeviceMesh | None, world: int
) -> nn.Module:
    """Step 4 of the checklist for one chunk: which data parallelism the plan and the model
    kind call for, applied; returns the module to train (DDP wraps, FSDP2/replicate do not)."""
    dp_mesh = sub_mesh(mesh, plan, "dp")
    if kind == "moe":
        if world == 1:
            return model
        # The dense part is data parallel over every rank (EP ranks see different tokens).
        group = dp_mesh.get_group() if plan.ep == 1 else dist.group.WORLD
        return apply_ddp(model, group, plan.bucket_cap_mb)
    if dp_mesh is None:
        return model
    if plan.dp_kind == "fsdp":
        apply_fsdp(model, dp_mesh, fsdp_units(kind, model), plan.reshard_after_forward)
        return model
    if kind not in VISION_KINDS and (plan.tp > 1 or plan.pp > 1):
        apply_replicate(model, dp_mesh)
        return model
    return apply_ddp(model, dp_mesh.get_group(), plan.bucket_cap_mb)


def build_schedule(
    chunks: list[nn.Module],
    stage_ids: list[int],
    plan: ParallelPlan,
    pp_mesh: DeviceMesh,
    device: torch.device,
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    """The pipeline schedule running this rank's stages over ``pp_mesh`` (after data
    parallelism: a stage wraps the module that FSDP2/replicate already made data parallel)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    pp_group = pp_mesh.get_group()
    n_stages = plan.n_stages()
    stages = [
        PipelineStage(c, s, n_stages, device, group=pp_group)
        for c, s in zip(chunks, stage_ids, strict=True)
    ]
    if plan.pp_schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, plan.microbatches, loss_fn=lm_loss)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[plan.pp_schedule]
    return cls(stages[0], plan.microbatches, loss_fn=lm_loss)


def parallelize(
    kind: str,
    cfg: ModelConfig,
    plan: ParallelPlan,
    mesh: DeviceMesh | None,
    coords: dict[str, int],
    device: torch.device,
) -> Parallelized:
    """Build this rank's model for ``plan`` (already resolved) and apply it, in checklist order.

    The seed must be set before the call: chunks are built (and initialised) first.
    """
    chunks = build_chunks(kind, cfg, plan, coords["pp"], device)
    out = Parallelized(modules=chunks, chunks=chunks)
    # TP before data parallelism: FSDP2/replicate then shard or replicate the TP-local DTensors.
    if kind == "gpt" and (tp_mesh := sub_mesh(mesh, plan, "tp")) is not None:
        apply_tp(chunks, tp_mesh, plan.sequence_parallel)
    # EP before DDP: DDP must be told which (expert) parameters to leave alone when it wraps.
    if kind == "moe" and (ep_mesh := sub_mesh(mesh, plan, "ep")) is not None:
        out.expert_params = apply_ep(chunks[0], ep_mesh)
    out.modules = [data_parallel(kind, c, plan, mesh, dist.get_world_size()) for c in chunks]
    # The schedule last: its stages hold the data-parallel modules.
    if kind == "gpt" and plan.pp > 1:
        out.stage_ids = plan.stage_ids(coords["pp"])
        out.schedule = build_schedule(
            out.modules, out.stage_ids, plan, sub_mesh(mesh, plan, "pp"), device
        )
        out.first = 0 in out.stage_ids
        out.last = (plan.n_stages() - 1) in out.stage_ids
    return out
