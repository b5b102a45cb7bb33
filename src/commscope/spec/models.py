"""Model configurations (torch-free): the shape of every model family a cell can train.

The ``nn.Module`` definitions live in :mod:`commscope.workload` (``models``, ``moe``, ``vision``);
the config dataclasses live here so the config checks and the predictor can read a model's shape
without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

MODEL_KINDS = ("gpt", "moe", "resnet50", "vgg16")
VISION_KINDS = ("resnet50", "vgg16")
VISION_ARCHS = ("resnet50", "vgg16")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-style decoder; ``batch`` is the per-replica batch of one step."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    seq: int = 64
    vocab: int = 512
    batch: int = 8
    ffn_mult: int = 4


@dataclass(frozen=True)
class MoEConfig(GPTConfig):
    """GPT shape plus the MoE knobs.

    ``capacity_factor`` scales each expert's slot count (``ceil(cf * tokens * top_k / experts)``
    per forward and rank); ``aux_loss_coef`` weighs the load-balancing loss that
    :class:`~commscope.workload.moe.MoEGPT` returns; block ``i`` is an MoE block when
    ``i % moe_every == moe_every - 1`` (every block for 1, the odd ones for 2 as in GShard/Switch).
    """

    experts: int = 4
    top_k: int = 1
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    moe_every: int = 1


@dataclass(frozen=True)
class VisionConfig:
    """An image-classification workload; ``batch`` is the per-replica batch of one step."""

    arch: str = "resnet50"
    image: int = 224
    batch: int = 32
    num_classes: int = 1000


def model_config(spec: dict[str, Any]) -> Any:
    """The model's config dataclass from its config entry (``kind`` picks the family)."""
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


def is_moe_block(cfg: MoEConfig, index: int) -> bool:
    """Whether block ``index`` carries an MoE layer instead of a dense MLP."""
    return index % cfg.moe_every == cfg.moe_every - 1


def expert_capacity(cfg: MoEConfig, tokens: int) -> int:
    """Slots per expert for ``tokens`` local tokens: ``ceil(capacity_factor * tokens * top_k /
    experts)``."""
    return math.ceil(cfg.capacity_factor * tokens * cfg.top_k / cfg.experts)


def validate_moe(cfg: MoEConfig, ep_size: int) -> list[str]:
    """Problems that make this MoE model impossible with ``ep_size`` EP ranks (empty = ok)."""
    problems = []
    if cfg.hidden % cfg.heads:
        problems.append(f"model.hidden={cfg.hidden} must be divisible by model.heads={cfg.heads}")
    if cfg.experts < 1:
        problems.append(f"model.experts ({cfg.experts}) must be >= 1")
    if cfg.top_k not in (1, 2):
        problems.append(f"model.top_k ({cfg.top_k}) must be 1 (Switch) or 2 (GShard)")
    elif cfg.top_k > cfg.experts:
        problems.append(f"model.top_k ({cfg.top_k}) exceeds model.experts ({cfg.experts})")
    if ep_size < 1:
        problems.append(f"expert-parallel size ({ep_size}) must be >= 1")
    elif cfg.experts >= 1 and cfg.experts % ep_size:
        problems.append(
            f"model.experts ({cfg.experts}) must be divisible by the expert-parallel size "
            f"({ep_size}) so every rank holds the same number of experts"
        )
    if cfg.capacity_factor <= 0:
        problems.append(f"model.capacity_factor ({cfg.capacity_factor}) must be > 0")
    if cfg.aux_loss_coef < 0:
        problems.append(f"model.aux_loss_coef ({cfg.aux_loss_coef}) must be >= 0")
    if cfg.moe_every < 1:
        problems.append(f"model.moe_every ({cfg.moe_every}) must be >= 1")
    elif cfg.moe_every > cfg.layers:
        problems.append(
            f"model.moe_every ({cfg.moe_every}) exceeds model.layers ({cfg.layers}): "
            "no block would be an MoE block"
        )
    return problems


# Parameters of the vision models less their classifier's, and the classifier's input width:
# torchvision's ResNet-50 (25,557,032 with 1000 classes) and VGG16 (138,357,544), which
# commscope.workload.vision reproduces parameter for parameter. VGG16's first classifier layer
# reads the 7 x 7 adaptive pool whatever the image side.
_VISION_BODY_PARAMS = {"resnet50": 23_508_032, "vgg16": 14_714_688 + 102_764_544 + 16_781_312}
_VISION_HEAD_IN = {"resnet50": 2048, "vgg16": 4096}
# Bytes a trained parameter costs a rank that holds it whole: fp32 weight and gradient and
# AdamW's two fp32 moments (activations come on top).
TRAIN_BYTES_PER_PARAM = 16
# The largest model a sweep may train: 10 billion parameters, 160 GB of weights, gradients and
# AdamW state unsharded. Generous for an emulated cluster (the default study's models have ~1 M)
# yet far below the typo it catches (hidden: 1000000 makes 10^13 parameters, terabytes per rank).
MAX_MODEL_PARAMS = 10**10


def param_count(spec: dict[str, Any]) -> int:
    """Parameters of the model a ``models:`` entry trains, unsharded (closed form: nothing is
    built). GPT and MoE as :mod:`commscope.workload.models` and ``moe`` define them (biased
    projections, LayerNorms, untied head without bias); the vision models as torchvision's."""
    cfg = model_config(spec)
    if isinstance(cfg, VisionConfig):
        return _VISION_BODY_PARAMS[cfg.arch] + (_VISION_HEAD_IN[cfg.arch] + 1) * cfg.num_classes
    h, f = cfg.hidden, cfg.ffn_mult * cfg.hidden
    attention = 4 * (h * h + h) + 4 * h  # q, k, v, proj and two LayerNorms
    mlp = f * h + f + h * f + h
    blocks = cfg.layers * (attention + mlp)
    if isinstance(cfg, MoEConfig):
        moe_blocks = sum(1 for i in range(cfg.layers) if is_moe_block(cfg, i))
        blocks += moe_blocks * ((cfg.experts - 1) * mlp + cfg.experts * h)  # experts, router
    return (cfg.vocab + cfg.seq) * h + blocks + 2 * h + cfg.vocab * h


# What model_config returns: the config of one of MODEL_KINDS.
ModelConfig = GPTConfig | MoEConfig | VisionConfig
