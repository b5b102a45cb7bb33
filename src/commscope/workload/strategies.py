"""Parallelism strategies built from PyTorch's own distributed APIs, composed over a DeviceMesh.

A strategy is a :class:`ParallelPlan`: degrees for data (``dp``), tensor (``tp``), pipeline
(``pp``) and expert (``ep``) parallelism, how the data-parallel dimension synchronises
(``dp_kind``: DDP-style replication or FSDP2 sharding), and a *mapping* — the order of the mesh
dimensions from outermost to innermost. Ranks on a node are contiguous, so the innermost
dimension stays inside a node: ``pp-dp-tp`` (Megatron's default) keeps TP groups on a node,
``tp-dp-pp`` spreads them across nodes (seed 002's default vs customized mapping).

Each strategy class has ``step(i)`` running one optimizer step and marking its phases (forward /
backward / optimizer) in the capture, so every recorded op carries the phase it was issued in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from commscope.workload import capture
from commscope.workload.models import GPT, GPTConfig, lm_loss, split_layers, synthetic_batch

DIMS = ("pp", "dp", "ep", "tp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees and placement of one strategy. A degree of -1 takes the remaining ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp_kind: str = "ddp"
    mapping: str = "pp-dp-ep-tp"
    pp_schedule: str = "1f1b"
    microbatches: int = 4
    stages_per_rank: int = 1
    reshard_after_forward: bool = True
    bucket_cap_mb: float = 25.0
    sequence_parallel: bool = False

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> ParallelPlan:
        known = {f.name for f in fields(cls)}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown strategy keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**spec)

    def order(self) -> list[str]:
        """Mesh dimensions outer -> inner, as the mapping says (dims it omits go outermost)."""
        named = [d for d in self.mapping.split("-") if d]
        bad = [d for d in named if d not in DIMS]
        if bad or len(set(named)) != len(named):
            raise ValueError(
                f"strategy mapping {self.mapping!r}: use each of {DIMS} at most once, "
                "outermost first, joined by '-', e.g. pp-dp-tp"
            )
        return [d for d in DIMS if d not in named] + named

    def resolve(self, world: int) -> ParallelPlan:
        """Fill the one -1 degree so the degrees multiply to ``world``; check they do."""
        degrees = {d: getattr(self, d) for d in DIMS}
        free = [d for d, v in degrees.items() if v == -1]
        if len(free) > 1:
            raise ValueError(f"strategy: only one degree may be -1, got {free}")
        fixed = 1
        for d, v in degrees.items():
            if v != -1:
                if v < 1:
                    raise ValueError(f"strategy: degree {d}={v} must be >= 1 or -1")
                fixed *= v
        if free:
            if world % fixed:
                raise ValueError(
                    f"strategy degrees {degrees}: fixed degrees multiply to {fixed}, which "
                    f"does not divide the world size {world}"
                )
            degrees[free[0]] = world // fixed
        elif fixed != world:
            raise ValueError(
                f"strategy degrees {degrees} multiply to {fixed} but the cell has {world} ranks "
                "(nodes x ranks_per_node); set one degree to -1 or change the cell"
            )
        return replace(self, **degrees)

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Shape and names of the device mesh (dims of size 1 left out), outer -> inner."""
        names = tuple(d for d in self.order() if getattr(self, d) > 1)
        return tuple(getattr(self, d) for d in names), names

    def group_of(self, dim: str, rank: int) -> list[int]:
        """Global ranks in ``rank``'s group along ``dim`` (pure: no process groups needed)."""
        shape, names = self.mesh_shape()
        if dim not in names:
            return [rank]
        strides = []
        acc = 1
        for size in reversed(shape):
            strides.append(acc)
            acc *= size
        strides = list(reversed(strides))
        k = names.index(dim)
        base = rank - ((rank // strides[k]) % shape[k]) * strides[k]
        return [base + i * strides[k] for i in range(shape[k])]

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every dimension (0 for unused dims)."""
        shape, names = self.mesh_shape()
        out = {d: 0 for d in DIMS}
        rem = rank
        for size, name in zip(reversed(shape), reversed(names), strict=True):
            out[name] = rem % size
            rem //= size
        return out


BUILTIN_STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"dp": -1},
    "fsdp": {"dp": -1, "dp_kind": "fsdp"},
    "tp": {"tp": -1},
    "pp": {"pp": -1},
    "ep": {"ep": -1},
}


@dataclass
class StepLog:
    """Phase intervals of this rank: (step, phase, t_start_ns, t_end_ns)."""

    rows: list[tuple[int, str, int, int]] = field(default_factory=list)

    def timed(self, step: int, phase: str, fn: Callable[[], object]) -> object:
        capture.set_phase(phase)
        t0 = time.time_ns()
        out = fn()
        self.rows.append((step, phase, t0, time.time_ns()))
        return out


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


MODEL_KINDS = ("gpt", "moe", "resnet50", "vgg16")
VISION_KINDS = ("resnet50", "vgg16")


def model_config(spec: dict[str, Any]) -> Any:
    """The model's config dataclass from its config entry (``kind`` picks the family)."""
    from commscope.workload.moe import MoEConfig
    from commscope.workload.vision import VisionConfig

    kind = spec.get("kind", "gpt")
    fields_of = {
        "gpt": GPTConfig,
        "moe": MoEConfig,
        "resnet50": VisionConfig,
        "vgg16": VisionConfig,
    }[kind]
    known = {f.name for f in fields(fields_of)}
    values = {k: v for k, v in spec.items() if k in known}
    if kind in VISION_KINDS:
        values["arch"] = kind
    return fields_of(**values)


class Trainer:
    """Builds the model for a plan on this rank and runs optimizer steps.

    Per step it keeps this rank's loss (``stats``) and, for MoE models, the token counts each
    MoE layer sent to every expert-parallel rank (``moe_rows``).
    """

    def __init__(
        self,
        model_spec: dict[str, Any],
        plan: ParallelPlan,
        device: torch.device,
        seed: int,
        log: StepLog,
    ) -> None:
        self.kind = model_spec.get("kind", "gpt")
        self.cfg = model_config(model_spec)
        self.device, self.seed, self.log = device, seed, log
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.plan = plan.resolve(self.world)
        shape, names = self.plan.mesh_shape()
        self.mesh: DeviceMesh | None = (
            init_device_mesh(device.type, shape, mesh_dim_names=names) if names else None
        )
        self.coords = self.plan.coords(self.rank)
        self.dataset = None
        if model_spec.get("data", "synthetic") == "stdlib":
            from commscope.workload.corpus import CharDataset, load_stdlib_corpus

            self.dataset = CharDataset(load_stdlib_corpus(), self.cfg.seq)
        self.stats: list[dict[str, Any]] = []
        self.moe_rows: list[dict[str, Any]] = []
        self.expert_params: list[torch.nn.Parameter] = []
        torch.manual_seed(seed)
        self.modules = self._build()
        params = [p for m in self.modules for p in m.parameters()]
        self.opt = torch.optim.AdamW(params, lr=float(model_spec.get("lr", 1e-3)))

    # -- building -------------------------------------------------------------------------
    def _sub(self, dim: str) -> DeviceMesh | None:
        return self.mesh[dim] if self.mesh is not None and getattr(self.plan, dim) > 1 else None

    def _build(self) -> list[torch.nn.Module]:
        if self.kind in VISION_KINDS:
            return [self._build_vision()]
        if self.kind == "moe":
            return [self._build_moe()]
        plan = self.plan
        chunks = self._pipeline_chunks() if plan.pp > 1 else [GPT(self.cfg).to(self.device)]
        tp_mesh = self._sub("tp")
        if tp_mesh is not None:
            from torch.distributed.tensor.parallel import parallelize_module

            sp = self.plan.sequence_parallel
            for chunk in chunks:
                blocks = list(chunk.layers.values())
                for i, block in enumerate(blocks):
                    if sp and len(blocks) == 1:
                        # Enter and leave in the same block: shard on entry, gather on exit.
                        parallelize_module(block, tp_mesh, tp_plan(True, first=True))
                        parallelize_module(block, tp_mesh, {"": tp_plan(True, last=True)[""]})
                        continue
                    block_plan = tp_plan(sp, first=i == 0, last=i == len(blocks) - 1)
                    parallelize_module(block, tp_mesh, block_plan)
        dp_mesh = self._sub("dp")
        if dp_mesh is not None:
            chunks = [self._data_parallel(c, dp_mesh) for c in chunks]
        if plan.pp > 1:
            self._make_schedule(chunks)
        return chunks

    def _build_vision(self) -> torch.nn.Module:
        from commscope.workload.vision import build_vision_model

        model = build_vision_model(self.cfg).to(self.device)
        dp_mesh = self._sub("dp")
        if dp_mesh is None:
            return model
        if self.plan.dp_kind == "fsdp":
            from torch.distributed.fsdp import fully_shard

            # One FSDP unit per top-level stage (ResNet layer1..4, VGG features/classifier).
            for child in model.children():
                if any(True for _ in child.parameters()):
                    fully_shard(
                        child, mesh=dp_mesh, reshard_after_forward=self.plan.reshard_after_forward
                    )
            fully_shard(model, mesh=dp_mesh, reshard_after_forward=self.plan.reshard_after_forward)
            return model
        return torch.nn.parallel.DistributedDataParallel(
            model, process_group=dp_mesh.get_group(), bucket_cap_mb=self.plan.bucket_cap_mb
        )

    def _build_moe(self) -> torch.nn.Module:
        from commscope.workload.moe import MoEGPT, apply_expert_parallel

        model = MoEGPT(self.cfg).to(self.device)
        self.moe_model = model
        ep_mesh = self._sub("ep")
        if ep_mesh is not None:
            names = apply_expert_parallel(model, ep_mesh.get_group())
            named = dict(model.named_parameters())
            self.expert_params = [named[n] for n in names]
            # Experts live on one rank each: DDP must not all-reduce them.
            torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                model, names
            )
        if self.world == 1:
            return model
        # The dense part is data parallel over every rank (EP ranks see different tokens).
        group = self._sub("dp").get_group() if self.plan.ep == 1 else dist.group.WORLD
        return torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=self.plan.bucket_cap_mb
        )

    def _pipeline_chunks(self) -> list[torch.nn.Module]:
        n_stages = self.plan.pp * self.plan.stages_per_rank
        ranges = split_layers(self.cfg.layers, n_stages)
        pp_rank = self.coords["pp"]
        # Interleaved schedules give rank r the stages r, r + pp, r + 2pp, ... (looping).
        self.stage_ids = [pp_rank + k * self.plan.pp for k in range(self.plan.stages_per_rank)]
        return [
            GPT(
                self.cfg,
                ranges[s],
                has_embedding=s == 0,
                has_head=s == n_stages - 1,
            ).to(self.device)
            for s in self.stage_ids
        ]

    def _data_parallel(self, module: torch.nn.Module, dp_mesh: DeviceMesh) -> torch.nn.Module:
        plan = self.plan
        if plan.dp_kind == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in getattr(module, "layers", {}).values():
                fully_shard(block, mesh=dp_mesh, reshard_after_forward=plan.reshard_after_forward)
            fully_shard(module, mesh=dp_mesh, reshard_after_forward=plan.reshard_after_forward)
            return module
        if plan.tp > 1 or plan.pp > 1:
            # Composed with TP (DTensor parameters DDP cannot bucket) or PP (DDP's reducer
            # breaks when a rank runs several stages' backward per step), replicate with the
            # FSDP2-based `replicate`, as torchtitan does; pure DP keeps classic DDP.
            from torch.distributed._composable.replicate_with_fsdp import replicate

            replicate(module, mesh=dp_mesh)
            return module
        return torch.nn.parallel.DistributedDataParallel(
            module, process_group=dp_mesh.get_group(), bucket_cap_mb=plan.bucket_cap_mb
        )

    def _make_schedule(self, chunks: list[torch.nn.Module]) -> None:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        pp_group = self._sub("pp").get_group()
        n_stages = self.plan.pp * self.plan.stages_per_rank
        stages = [
            PipelineStage(c, s, n_stages, self.device, group=pp_group)
            for c, s in zip(chunks, self.stage_ids, strict=True)
        ]
        self.first = 0 in self.stage_ids
        self.last = (n_stages - 1) in self.stage_ids
        if self.plan.pp_schedule == "interleaved-1f1b":
            self.schedule = ScheduleInterleaved1F1B(stages, self.plan.microbatches, loss_fn=lm_loss)
        else:
            cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.plan.pp_schedule]
            self.schedule = cls(stages[0], self.plan.microbatches, loss_fn=lm_loss)

    # -- training -------------------------------------------------------------------------
    def replica(self) -> tuple[int, int]:
        """(index, count) of this rank's data-parallel replica: TP and PP peers share data."""
        return self.coords["dp"] * self.plan.ep + self.coords["ep"], self.plan.dp * self.plan.ep

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        index, count = self.replica()
        if self.kind in VISION_KINDS:
            from commscope.workload.vision import synthetic_images

            x, y = synthetic_images(self.cfg, self.cfg.batch, self.seed + 1000 * step + index)
        elif self.dataset is not None:
            x, y = self.dataset.batch(step, self.cfg.batch, self.seed, rank=index, world=count)
        else:
            x, y = synthetic_batch(self.cfg, self.cfg.batch, self.seed + 1000 * step + index)
        return x.to(self.device), y.to(self.device)

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.modules[0](x)
        if self.kind in VISION_KINDS:
            return torch.nn.functional.cross_entropy(out, y)
        if self.kind == "moe":
            logits, aux = out
            return lm_loss(logits, y) + aux
        return lm_loss(out, y)

    def step(self, i: int) -> None:
        x, y = self.batch(i)
        if self.plan.pp > 1:
            losses: list[torch.Tensor] = []

            def run() -> None:
                kwargs: dict[str, Any] = {}
                if self.last:
                    kwargs.update(target=y, losses=losses)
                self.schedule.step(x, **kwargs) if self.first else self.schedule.step(**kwargs)

            # The schedule interleaves forward and backward micro-batches: one phase.
            self.log.timed(i, "fwd_bwd", run)
            loss_value = float(torch.stack(losses).detach().mean()) if losses else float("nan")
        else:
            loss = self.log.timed(i, "fwd", lambda: self._loss(x, y))
            self.log.timed(i, "bwd", loss.backward)
            loss_value = float(loss.detach())
        self.log.timed(i, "optim", self._optim)
        self.stats.append({"step": i, "train_loss": loss_value})
        self._record_routing(i)

    def _optim(self) -> None:
        if self.expert_params and self.plan.ep > 1:
            # DDP averages dense gradients over ranks; an expert's gradient sums every EP rank's
            # tokens. Divide so both follow the gradient of the mean loss.
            for p in self.expert_params:
                if p.grad is not None:
                    p.grad.div_(self.plan.ep)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def _record_routing(self, step: int) -> None:
        if self.kind != "moe":
            return
        from commscope.workload.moe import moe_layers

        group = self.plan.group_of("ep", self.rank)
        for name, layer in moe_layers(self.moe_model).items():
            for entry in layer.split_history:
                for k, sent in enumerate(entry["input_splits"]):
                    self.moe_rows.append(
                        {
                            "step": step,
                            "layer": name,
                            "dst_rank": group[k] if k < len(group) else self.rank,
                            "tokens_sent": int(sent),
                            "tokens_received": int(entry["output_splits"][k]),
                            "dropped": int(entry["dropped"]),
                        }
                    )
            layer.split_history.clear()

    def grad_bytes(self) -> int:
        """Bytes of parameters (= gradients) this rank holds locally."""
        total = 0
        for m in self.modules:
            for p in m.parameters():
                local = p.to_local() if hasattr(p, "to_local") else p
                total += local.numel() * local.element_size()
        return total

    def param_count(self) -> int:
        return sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel()
            for m in self.modules
            for p in m.parameters()
        )


def validate_cell(model_spec: dict[str, Any], plan_spec: dict[str, Any], world: int) -> list[str]:
    """Problems that make this model and strategy impossible on ``world`` ranks (empty = ok).

    Messages name the config key and the fix; nothing here touches a node.
    """
    kind = model_spec.get("kind", "gpt")
    try:
        plan = ParallelPlan.from_dict(plan_spec).resolve(world)
        plan.order()
        cfg = model_config(model_spec)
    except (ValueError, TypeError) as err:
        return [str(err)]
    problems = []
    if kind in VISION_KINDS:
        if max(plan.tp, plan.pp, plan.ep) > 1:
            problems.append(
                f"model kind {kind} runs data parallel only (ddp or fsdp): tp/pp/ep = 1"
            )
        return problems
    if kind == "moe":
        from commscope.workload.moe import validate_moe

        problems += validate_moe(cfg, plan.ep)
        if plan.tp > 1 or plan.pp > 1:
            problems.append("model kind moe supports dp and ep (expert parallel), not tp/pp")
        if plan.ep > 1 and plan.dp > 1:
            problems.append("model kind moe: combine ep with dp=1 (the dense part is DP over ep)")
        if plan.dp_kind != "ddp":
            problems.append(
                "model kind moe: the dense part is replicated with DDP; use dp_kind: ddp"
            )
    elif plan.ep > 1:
        problems.append(f"ep={plan.ep} needs an MoE model (kind: moe); {kind} has no experts")
    if model_spec.get("data", "synthetic") == "stdlib" and cfg.vocab != 256:
        problems.append(f"data: stdlib is byte level: set model.vocab to 256 (is {cfg.vocab})")
    return problems + validate_plan(plan, cfg, world)


def validate_plan(plan: ParallelPlan, cfg: GPTConfig, world: int) -> list[str]:
    """Problems that make ``plan`` impossible on ``world`` ranks with this model (empty = ok)."""
    try:
        plan = plan.resolve(world)
        plan.order()
    except ValueError as err:
        return [str(err)]
    problems = []
    if cfg.hidden % cfg.heads:
        problems.append(f"model.hidden={cfg.hidden} must be divisible by model.heads={cfg.heads}")
    if plan.dp_kind not in ("ddp", "fsdp"):
        problems.append(f"strategy dp_kind {plan.dp_kind!r}: use ddp or fsdp")
    if plan.sequence_parallel and plan.tp > 1 and cfg.seq % plan.tp:
        problems.append(f"sequence_parallel needs model.seq ({cfg.seq}) divisible by tp={plan.tp}")
    if plan.tp > 1:
        if cfg.heads % plan.tp:
            problems.append(f"tp={plan.tp} needs model.heads ({cfg.heads}) divisible by {plan.tp}")
        if (cfg.ffn_mult * cfg.hidden) % plan.tp:
            problems.append(f"tp={plan.tp} needs the MLP width divisible by {plan.tp}")
    if plan.pp > 1:
        if plan.pp_schedule not in PP_SCHEDULES:
            problems.append(f"pp_schedule {plan.pp_schedule!r}: use one of {PP_SCHEDULES}")
        n_stages = plan.pp * plan.stages_per_rank
        if cfg.layers < n_stages:
            problems.append(
                f"pp={plan.pp} x stages_per_rank={plan.stages_per_rank} needs model.layers "
                f"({cfg.layers}) >= {n_stages} stages"
            )
        if plan.pp_schedule == "interleaved-1f1b" and plan.stages_per_rank < 2:
            problems.append("interleaved-1f1b needs stages_per_rank >= 2")
        if plan.pp_schedule != "interleaved-1f1b" and plan.stages_per_rank != 1:
            problems.append(f"{plan.pp_schedule} runs one stage per rank: set stages_per_rank 1")
        if plan.pp_schedule in ("1f1b", "interleaved-1f1b") and plan.microbatches < plan.pp:
            problems.append(
                f"pp with the {plan.pp_schedule} schedule needs microbatches "
                f"({plan.microbatches}) >= the number of pipeline ranks ({plan.pp}); raise "
                "microbatches or use pp_schedule: gpipe"
            )
        if cfg.batch % plan.microbatches:
            problems.append(
                f"pp needs model.batch ({cfg.batch}) divisible by microbatches "
                f"({plan.microbatches})"
            )
    return problems
