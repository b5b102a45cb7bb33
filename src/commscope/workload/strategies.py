"""Parallelism strategies built from PyTorch's own distributed APIs.

Each strategy is a small class with ``step(i)`` running one optimizer step and marking its phases
(forward / backward / optimizer) in the capture, so every recorded op carries the phase it was
issued in. All take the model config and the world; they assume ``init_process_group`` ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from commscope.workload import capture
from commscope.workload.models import GPT, GPTConfig, lm_loss, split_layers, synthetic_batch

STRATEGIES = ("ddp", "fsdp", "tp", "pp")


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


@dataclass(frozen=True)
class RunSettings:
    """Per-run knobs that are not part of the model shape."""

    device: str = "cpu"
    seed: int = 0
    lr: float = 1e-3
    bucket_cap_mb: float = 25.0
    microbatches: int = 4
    pp_schedule: str = "1f1b"


class Strategy:
    """Common loop: forward, backward, optimizer step; subclasses build the model."""

    name = "base"

    def __init__(self, cfg: GPTConfig, settings: RunSettings, log: StepLog) -> None:
        self.cfg, self.settings, self.log = cfg, settings, log
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(settings.device)
        self.model = self.build()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=settings.lr)

    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Data-parallel strategies give each rank its own shard of the global batch."""
        x, y = synthetic_batch(
            self.cfg, self.cfg.batch, self.settings.seed + 1000 * step + self.rank
        )
        return x.to(self.device), y.to(self.device)

    def step(self, i: int) -> None:
        x, y = self.batch(i)
        loss = self.log.timed(i, "fwd", lambda: lm_loss(self.model(x), y))
        self.log.timed(i, "bwd", loss.backward)
        self.log.timed(i, "optim", self._optim)

    def _optim(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def grad_bytes(self) -> int:
        """Bytes of gradients this rank holds locally (the DDP all-reduce payload)."""
        total = 0
        for p in self.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
        return total


class DDPStrategy(Strategy):
    name = "ddp"

    def build(self) -> torch.nn.Module:
        torch.manual_seed(self.settings.seed)
        model = GPT(self.cfg).to(self.device)
        return torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=self.settings.bucket_cap_mb
        )


class FSDPStrategy(Strategy):
    name = "fsdp"

    def build(self) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(self.settings.seed)
        model = GPT(self.cfg).to(self.device)
        mesh = init_device_mesh(self.device.type, (self.world,))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model


class TPStrategy(Strategy):
    """Megatron-style tensor parallelism over all ranks: q/k/v, fc1 column-wise; proj, fc2
    row-wise. Embeddings and head stay replicated; every rank sees the same batch."""

    name = "tp"

    def build(self) -> torch.nn.Module:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        torch.manual_seed(self.settings.seed)
        model = GPT(self.cfg).to(self.device)
        mesh = init_device_mesh(self.device.type, (self.world,))
        plan = {
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(),
        }
        for block in model.layers.values():
            parallelize_module(block, mesh, plan)
        return model

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = synthetic_batch(self.cfg, self.cfg.batch, self.settings.seed + 1000 * step)
        return x.to(self.device), y.to(self.device)


class PPStrategy(Strategy):
    """Pipeline parallelism with torch.distributed.pipelining: one stage per rank, layers split
    contiguously (remainder to the first stages), embedding on the first stage, head on the last."""

    name = "pp"

    def build(self) -> torch.nn.Module:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        torch.manual_seed(self.settings.seed)
        ranges = split_layers(self.cfg.layers, self.world)
        first, last = self.rank == 0, self.rank == self.world - 1
        model = GPT(self.cfg, ranges[self.rank], has_embedding=first, has_head=last)
        model.to(self.device)
        stage = PipelineStage(model, self.rank, self.world, self.device)
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.settings.pp_schedule]
        self.schedule = schedule_cls(stage, self.settings.microbatches, loss_fn=lm_loss)
        return model

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = synthetic_batch(self.cfg, self.cfg.batch, self.settings.seed + 1000 * step)
        return x.to(self.device), y.to(self.device)

    def step(self, i: int) -> None:
        x, y = self.batch(i)

        def run() -> None:
            if self.rank == 0:
                self.schedule.step(x)
            elif self.rank == self.world - 1:
                self.schedule.step(target=y)
            else:
                self.schedule.step()

        # The schedule interleaves forward and backward micro-batches: one "fwd_bwd" phase.
        self.log.timed(i, "fwd_bwd", run)
        self.log.timed(i, "optim", self._optim)


def make_strategy(name: str, cfg: GPTConfig, settings: RunSettings, log: StepLog) -> Strategy:
    """Instantiate a strategy by its config name."""
    classes = {c.name: c for c in (DDPStrategy, FSDPStrategy, TPStrategy, PPStrategy)}
    if name not in classes:
        raise ValueError(f"strategy {name!r} unknown; choose one of {sorted(classes)}")
    return classes[name](cfg, settings, log)


def validate_degrees(
    name: str, cfg: GPTConfig, world: int, microbatches: int, pp_schedule: str = "1f1b"
) -> list[str]:
    """Problems that make ``name`` impossible on ``world`` ranks with this model (empty = ok)."""
    problems = []
    if cfg.hidden % cfg.heads:
        problems.append(f"model.hidden={cfg.hidden} must be divisible by model.heads={cfg.heads}")
    if name == "tp":
        if cfg.heads % world:
            problems.append(
                f"tp over {world} ranks needs model.heads ({cfg.heads}) divisible by {world}"
            )
        if (cfg.ffn_mult * cfg.hidden) % world:
            problems.append(f"tp over {world} ranks needs the MLP width divisible by {world}")
    if name == "pp":
        if cfg.layers < world:
            problems.append(
                f"pp over {world} ranks needs model.layers ({cfg.layers}) >= {world} stages"
            )
        if pp_schedule == "1f1b" and microbatches < world:
            problems.append(
                f"pp with the 1f1b schedule needs run.microbatches ({microbatches}) >= the "
                f"number of stages ({world}); raise run.microbatches or use pp_schedule: gpipe"
            )
        if cfg.batch % microbatches:
            problems.append(
                f"pp needs model.batch ({cfg.batch}) divisible by microbatches ({microbatches})"
            )
    return problems
