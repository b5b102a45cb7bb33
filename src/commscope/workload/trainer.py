"""The training loop of one rank: a plan applied to a model (:mod:`.parallelize`), optimizer steps.

Each step runs one optimizer step and marks its phases (forward / backward / optimizer, or one
``fwd_bwd`` phase for a pipeline schedule) in the capture, so every recorded op carries the phase
it was issued in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from commscope.spec.models import VISION_KINDS, model_config
from commscope.spec.plan import ParallelPlan
from commscope.workload import capture
from commscope.workload.corpus import CharDataset, load_stdlib_corpus
from commscope.workload.models import lm_loss, synthetic_batch
from commscope.workload.moe import moe_layers
from commscope.workload.parallelize import parallelize
from commscope.workload.vision import synthetic_images


@dataclass
class StepLog:
    """Phase intervals of this rank: (step, phase, t_start_ns, t_end_ns)."""

    rows: list[tuple[int, str, int, int]] = field(default_factory=list)

    def timed(self, step: int, phase: str, fn: Callable[[], object]) -> object:
        """Run ``fn`` with the capture's phase set to ``phase``; log its interval."""
        capture.set_phase(phase)
        t0 = time.time_ns()
        out = fn()
        self.rows.append((step, phase, t0, time.time_ns()))
        return out


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
            self.dataset = CharDataset(load_stdlib_corpus(), self.cfg.seq)
        self.stats: list[dict[str, Any]] = []
        self.moe_rows: list[dict[str, Any]] = []
        torch.manual_seed(seed)
        built = parallelize(self.kind, self.cfg, self.plan, self.mesh, self.coords, device)
        self.modules, self.chunks = built.modules, built.chunks
        self.expert_params = built.expert_params
        self.schedule, self.first, self.last = built.schedule, built.first, built.last
        params = [p for m in self.modules for p in m.parameters()]
        self.opt = torch.optim.AdamW(params, lr=float(model_spec.get("lr", 1e-3)))

    def replica(self) -> tuple[int, int]:
        """(index, count) of this rank's data-parallel replica: TP and PP peers share data."""
        return self.coords["dp"] * self.plan.ep + self.coords["ep"], self.plan.dp * self.plan.ep

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's inputs and targets of ``step`` on the device."""
        index, count = self.replica()
        if self.kind in VISION_KINDS:
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
        """One optimizer step, its phases timed in the log and marked in the capture."""
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
        group = self.plan.group_of("ep", self.rank)
        for name, layer in moe_layers(self.chunks[0]).items():
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
        """Parameters this rank holds locally (DTensor shards counted by their local part)."""
        return sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel()
            for m in self.modules
            for p in m.parameters()
        )
