"""A real text corpus that is always available offline: the Python standard library's source.

Learning runs (e.g. watching MoE routing, and so the all-to-all traffic matrix, evolve as a model
trains) need data with structure; random tokens give a router nothing to specialise on. Every
machine that runs commscope has a Python installation, so its ``*.py`` standard library files are
a corpus that needs no download. Modelled at the byte level (vocabulary 256), so no tokenizer is
needed either.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

VOCAB = 256  # byte values
# Third-party code installed under the stdlib directory is not the standard library and varies
# between machines; caches hold no source.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_source_files(root: str | None = None) -> list[Path]:
    """The ``*.py`` files under the standard library directory, sorted by relative path (so the
    order is the same on every machine with the same Python version)."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        files += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def load_stdlib_corpus(max_bytes: int = 2_000_000) -> bytes:
    """The standard library's sources concatenated in sorted order, cut at ``max_bytes``."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    parts, total = [], 0
    for path in stdlib_source_files():
        data = path.read_bytes()
        parts.append(data[: max_bytes - total])
        total += len(parts[-1])
        if total >= max_bytes:
            break
    return b"".join(parts)


def _step_seed(seed: int, step: int) -> int:
    # SeedSequence mixes (seed, step) so neighbouring steps get unrelated generator states.
    return int(np.random.SeedSequence([seed, step]).generate_state(1, np.uint64)[0])


class CharDataset:
    """Byte-level language-modelling windows of ``seq`` bytes drawn from ``corpus``."""

    vocab = VOCAB

    def __init__(self, corpus: bytes, seq: int) -> None:
        if len(corpus) < seq + 1:
            raise ValueError(f"corpus of {len(corpus)} bytes is too short for seq={seq}")
        self.seq = seq
        self.data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)

    def __len__(self) -> int:
        """Number of distinct window start offsets."""
        return self.data.numel() - self.seq

    def batch(
        self, step: int, batch_size: int, seed: int, rank: int = 0, world: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs ``x`` and next-byte targets ``y`` (``y[:, i] == x[:, i + 1]``), both
        ``(batch_size, seq)`` int64.

        The step's global batch of ``world * batch_size`` windows depends only on
        ``(seed, step)``; rank ``r`` takes its ``r``-th slice, so ranks see different data and the
        whole run is reproducible.
        """
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world {world}")
        gen = torch.Generator().manual_seed(_step_seed(seed, step))
        starts = torch.randint(0, len(self), (world * batch_size,), generator=gen)
        starts = starts[rank * batch_size : (rank + 1) * batch_size]
        windows = self.data[starts.unsqueeze(1) + torch.arange(self.seq + 1)].long()
        return windows[:, :-1], windows[:, 1:]
