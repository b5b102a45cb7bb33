"""Models defined in the project (no downloads).

The GPT decoder keeps the attention and MLP projections as separate ``nn.Linear`` modules with
stable names so tensor parallelism can shard them Megatron-style (q/k/v and fc1 column-wise,
proj and fc2 row-wise), and so pipeline stages can take a contiguous slice of blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commscope.spec.models import GPTConfig


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.q = nn.Linear(cfg.hidden, cfg.hidden)
        self.k = nn.Linear(cfg.hidden, cfg.hidden)
        self.v = nn.Linear(cfg.hidden, cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them.
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn_mult * cfg.hidden)
        self.fc2 = nn.Linear(cfg.ffn_mult * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer. Any of embedding/head may be absent in a pipeline stage."""

    def __init__(
        self,
        cfg: GPTConfig,
        layer_ids: range | None = None,
        has_embedding: bool = True,
        has_head: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        ids = layer_ids if layer_ids is not None else range(cfg.layers)
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden) if has_embedding else None
        self.pos_emb = nn.Embedding(cfg.seq, cfg.hidden) if has_embedding else None
        # ModuleDict keyed by global layer index keeps parameter names stable across stages.
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in ids})
        self.norm = nn.LayerNorm(cfg.hidden) if has_head else None
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False) if has_head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
        for block in self.layers.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over the flattened batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def synthetic_batch(cfg: GPTConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and their shifted targets, reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]
