"""Mixture-of-experts GPT with top-1/top-2 gating and expert parallelism over all-to-all.

Built from the dense GPT's pieces (``models.Attention``, ``models.MLP``, ``models.Block``): every
``moe_every``-th block replaces its MLP by an :class:`MoELayer` — a softmax router choosing the
top-1 (Switch) or top-2 (GShard) experts per token, a per-expert capacity beyond which tokens are
dropped (they ride the residual connection unchanged) and the Switch load-balancing loss.

Expert parallelism (EP): :meth:`MoELayer.set_expert_parallel` keeps only this rank's slice of the
experts; the forward then ships every token to the rank that owns its expert with
``all_to_all_single`` (variable split sizes, announced first by an all-to-all of per-expert
counts) and brings the results back with a second one. Backward issues the mirror all-to-alls.
The split sizes of every forward are kept (``split_history``) because the imbalance of those
all-to-alls — how routing skews the traffic matrix, and how it evolves during training — is what
the project measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commscope.spec.models import MoEConfig, expert_capacity, is_moe_block
from commscope.workload.models import MLP, Attention, Block


@dataclass
class Routing:
    """Where one forward's tokens go. Assignments are the kept (token, expert) pairs sorted by
    expert (stable), so each expert's tokens form a contiguous run of ``expert_counts[e]`` rows."""

    token_idx: torch.Tensor  # (kept,) int64 token row of each kept assignment
    expert_idx: torch.Tensor  # (kept,) int64 expert of each kept assignment, non-decreasing
    gate: torch.Tensor  # (kept,) float combine weight (differentiable w.r.t. the router)
    expert_counts: torch.Tensor  # (experts,) int64 kept assignments per expert
    dropped: int  # assignments beyond capacity
    aux_loss: torch.Tensor  # scalar Switch load-balancing loss (unscaled)


def route(logits: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """Top-k softmax routing with capacity, GShard-style priorities.

    ``logits`` is ``(tokens, experts)``. Top-1 gates are the chosen expert's probability (Switch);
    top-2 gates are the two probabilities renormalised to sum to one (GShard). Capacity is filled
    in token order with all first choices ahead of any second choice, so a token loses its second
    expert before another token loses its first. The aux loss is ``experts * sum_i f_i * P_i``
    with ``f_i`` the fraction of (pre-drop) assignments to expert ``i`` and ``P_i`` its mean router
    probability: 1 at perfectly uniform routing, up to ``experts`` when everything collapses onto
    one expert.
    """
    tokens, experts = logits.shape
    # Softmax in float32: bf16/fp16 router probabilities are too coarse to rank experts stably.
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)  # (tokens, k)
    if top_k > 1:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    # Choice-major order: all first choices, then all second choices.
    flat_e = top_e.t().reshape(-1)
    flat_p = top_p.t().reshape(-1)
    flat_tok = torch.arange(tokens, device=logits.device).repeat(top_k)
    onehot = F.one_hot(flat_e, experts)
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # slot this assignment would take
    keep = position < capacity
    # Stable sort by expert keeps token order inside each expert's run.
    order = torch.sort(flat_e[keep], stable=True).indices
    expert_idx = flat_e[keep][order]
    frac = onehot.sum(0).float() / max(tokens * top_k, 1)
    aux = experts * (frac * probs.mean(0)).sum() if tokens else probs.sum() * 0.0
    return Routing(
        token_idx=flat_tok[keep][order],
        expert_idx=expert_idx,
        gate=flat_p[keep][order],
        expert_counts=torch.bincount(expert_idx, minlength=experts),
        dropped=int((~keep).sum()),
        aux_loss=aux,
    )


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with variable splits whose backward is the reverse all-to-all.

    Written out rather than ``torch.distributed.nn.functional.all_to_all_single``, which torch
    marks deprecated; it issues the same c10d ``alltoall_base_`` op either way.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        back = _AllToAll.apply(grad.contiguous(), ctx.in_splits, ctx.out_splits, ctx.group)
        return back, None, None, None


class MoELayer(nn.Module):
    """Router plus experts (each a ``models.MLP``: hidden -> ffn_mult*hidden -> hidden).

    ``forward(x) -> (y, aux_loss)`` with ``y`` zero for dropped tokens, so that inside a block
    (``x + y``) they pass through unchanged. Experts live in a ``ModuleDict`` keyed by their
    *global* index so parameter names (``experts.5.fc1.weight``) mean the same expert on every EP
    rank and in the non-parallel model.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = nn.ModuleDict({str(e): MLP(cfg) for e in range(cfg.experts)})
        self.group: dist.ProcessGroup | None = None
        self.local_experts = range(cfg.experts)
        # Tokens sent to each EP rank by the last forward, and one entry per forward.
        self.last_split_sizes: list[int] = []
        self.last_dropped = 0
        self.split_history: list[dict[str, Any]] = []

    def set_expert_parallel(self, group: dist.ProcessGroup) -> None:
        """Keep only this rank's experts ``[r*E/ep, (r+1)*E/ep)`` of ``group`` and route tokens to
        the others' over all-to-all. The remote experts are deleted, so their parameters are gone
        from ``parameters()`` and the state dict."""
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        if self.cfg.experts % ep:
            raise ValueError(f"{self.cfg.experts} experts do not split over {ep} EP ranks")
        per = self.cfg.experts // ep
        self.local_experts = range(rank * per, (rank + 1) * per)
        for e in range(self.cfg.experts):
            if e not in self.local_experts:
                del self.experts[str(e)]
        self.group = group

    def _run_local(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Apply local expert ``j`` to the ``counts[j]`` rows of its contiguous run."""
        chunks = torch.split(x, counts)
        outs = [self.experts[str(e)](c) for e, c in zip(self.local_experts, chunks, strict=True)]
        return torch.cat(outs) if outs else x

    def _experts_ep(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch expert-sorted rows to their owners, run the local experts, combine back."""
        assert self.group is not None
        ep, per = dist.get_world_size(self.group), len(self.local_experts)
        # 1) Announce how many rows each owner gets per expert (equal splits of ``per`` counts).
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        in_splits = counts.view(ep, per).sum(1).tolist()
        recv_by_src = recv_counts.view(ep, per)  # [source rank, local expert]
        out_splits = recv_by_src.sum(1).tolist()
        self.last_split_sizes = in_splits
        self.split_history.append(
            {
                "input_splits": in_splits,
                "output_splits": out_splits,
                "expert_counts": counts.tolist(),
                "dropped": self.last_dropped,
            }
        )
        # 2) Tokens: received rows are grouped by source rank, then by local expert.
        recv = _AllToAll.apply(x_sorted, out_splits, in_splits, self.group)
        local_id = torch.repeat_interleave(
            torch.arange(per, device=recv.device).repeat(ep), recv_by_src.reshape(-1)
        )
        order = torch.sort(local_id, stable=True).indices
        out_grouped = self._run_local(recv[order], recv_by_src.sum(0).tolist())
        out = out_grouped[torch.argsort(order)]  # back to (source, expert) layout
        # 3) Combine: results return to the ranks that own the tokens, in x_sorted order.
        return _AllToAll.apply(out, in_splits, out_splits, self.group)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        plan = route(self.router(flat), self.cfg.top_k, expert_capacity(self.cfg, flat.shape[0]))
        self.last_dropped = plan.dropped
        x_sorted = flat[plan.token_idx]
        if self.group is None:
            kept = int(plan.expert_counts.sum())
            self.last_split_sizes = [kept]
            self.split_history.append(
                {
                    "input_splits": [kept],
                    "output_splits": [kept],
                    "expert_counts": plan.expert_counts.tolist(),
                    "dropped": plan.dropped,
                }
            )
            y_sorted = self._run_local(x_sorted, plan.expert_counts.tolist())
        else:
            y_sorted = self._experts_ep(x_sorted, plan.expert_counts)
        y_sorted = y_sorted * plan.gate.to(y_sorted.dtype).unsqueeze(-1)
        # Tokens with no kept assignment get zeros: the residual carries them past this layer.
        y = torch.zeros_like(flat).index_add(0, plan.token_idx, y_sorted)
        return y.reshape(shape), plan.aux_loss


class MoEBlock(nn.Module):
    """``models.Block`` with its MLP replaced by an :class:`MoELayer` (same attribute names)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MoELayer(cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln1(x))
        y, aux = self.mlp(self.ln2(x))
        return x + y, aux


class MoEGPT(nn.Module):
    """Decoder-only transformer whose every ``moe_every``-th block is an :class:`MoEBlock`.

    Attribute names follow ``models.GPT`` (``tok_emb``, ``pos_emb``, ``layers.{i}``, ``norm``,
    ``head``) so dense parameters are named alike in both models.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq, cfg.hidden)
        self.layers = nn.ModuleDict(
            {
                str(i): MoEBlock(cfg) if is_moe_block(cfg, i) else Block(cfg)
                for i in range(cfg.layers)
            }
        )
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(batch, seq, vocab)`` and ``aux_loss_coef`` times the sum of the MoE layers'
        load-balancing losses (add it to the LM loss)."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        aux = x.new_zeros(())
        for block in self.layers.values():
            if isinstance(block, MoEBlock):
                x, layer_aux = block(x)
                aux = aux + layer_aux
            else:
                x = block(x)
        return self.head(self.norm(x)), self.cfg.aux_loss_coef * aux


def moe_layers(model: nn.Module) -> dict[str, MoELayer]:
    """Every :class:`MoELayer` of ``model`` by module name (e.g. ``layers.1.mlp``)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MoELayer)}


def apply_expert_parallel(model: nn.Module, group: dist.ProcessGroup) -> list[str]:
    """Shard the experts of every MoE layer over ``group``; returns the names of the expert
    parameters left on this rank.

    Pass those names to ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``
    before wrapping: each expert lives on one rank, so DDP must not all-reduce it. Note that an
    expert's gradient then *sums* the contributions of all EP ranks' tokens, while DDP *averages*
    the dense gradients; divide expert gradients by the EP size to match the gradient of the mean
    loss.
    """
    names = []
    for prefix, layer in moe_layers(model).items():
        layer.set_expert_parallel(group)
        names += [f"{prefix}.experts.{n}" for n, _ in layer.experts.named_parameters()]
    return names
