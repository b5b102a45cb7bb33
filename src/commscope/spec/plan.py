"""The parallel plan of a cell (torch-free): degrees, placement on the ranks, and its checks.

A strategy is a :class:`ParallelPlan`: degrees for data (``dp``), tensor (``tp``), pipeline
(``pp``) and expert (``ep``) parallelism, how the data-parallel dimension synchronises
(``dp_kind``: DDP-style replication or FSDP2 sharding), and a *mapping* — the order of the mesh
dimensions from outermost to innermost. Ranks on a node are contiguous, so the innermost
dimension stays inside a node: ``pp-dp-tp`` (Megatron's default) keeps TP groups on a node,
``tp-dp-pp`` spreads them across nodes (seed 002's default vs customized mapping).

Like torchtitan's ``ParallelDims`` the plan is a plain dataclass that checks its own degrees on
construction and answers mesh questions (``mesh_shape``, ``group_of``, ``coords``) without a
``DeviceMesh``, so config checks, the predictor and the trainer share one arithmetic.
:func:`validate_cell` / :func:`validate_plan` add the checks that need the model and the world.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from commscope.spec.models import (
    VISION_KINDS,
    GPTConfig,
    model_config,
    validate_moe,
)

DIMS = ("pp", "dp", "ep", "tp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees and placement of one strategy. A degree of -1 takes the remaining ranks.

    Construction checks the degrees alone (each >= 1, at most one -1); what depends on the world
    size is checked by :meth:`resolve`, what depends on the model by :func:`validate_plan`.
    ``mapping``, ``dp_kind`` and ``pp_schedule`` are left to :func:`validate_plan` so that a
    config check reports all of a plan's problems at once instead of the first.

    ``bucket_cap_mb`` None builds DDP without the argument, as users' jobs do: PyTorch's
    default buckets (25 MiB, the first one 1 MiB). A value is passed to DDP as given, which
    then caps every bucket, the first included, at it.
    """

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
    bucket_cap_mb: float | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        degrees = {d: getattr(self, d) for d in DIMS}
        free = [d for d, v in degrees.items() if v == -1]
        if len(free) > 1:
            raise ValueError(f"strategy: only one degree may be -1, got {free}")
        for d, v in degrees.items():
            if v != -1 and v < 1:
                raise ValueError(f"strategy: degree {d}={v} must be >= 1 or -1")

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> ParallelPlan:
        """The plan of a config's strategy entry; unknown keys are an error that lists the known
        ones."""
        known = {f.name for f in fields(cls)}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown strategy keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**spec)

    def order(self) -> list[str]:
        """Mesh dimensions outer -> inner, as the mapping says (dims it omits go outermost)."""
        why = mapping_problem(self.mapping)
        if why:
            raise ValueError(f"strategy mapping {why}")
        named = [d for d in self.mapping.split("-") if d]
        return [d for d in DIMS if d not in named] + named

    def resolve(self, world: int) -> ParallelPlan:
        """Fill the one -1 degree so the degrees multiply to ``world``; check they do."""
        degrees = {d: getattr(self, d) for d in DIMS}
        free = [d for d, v in degrees.items() if v == -1]
        fixed = 1
        for v in degrees.values():
            if v != -1:
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

    def n_stages(self) -> int:
        """Pipeline stages of the whole model: ``pp`` ranks times ``stages_per_rank`` each."""
        return self.pp * self.stages_per_rank

    def stage_ids(self, pp_rank: int) -> list[int]:
        """Stages run by the rank at pipeline coordinate ``pp_rank``: interleaved schedules give
        it the stages ``pp_rank, pp_rank + pp, pp_rank + 2pp, ...`` (looping)."""
        return [pp_rank + k * self.pp for k in range(self.stages_per_rank)]


def mapping_problem(mapping: str) -> str:
    """Why ``mapping`` is no order of mesh dimensions ('' when it is one): each of
    :data:`DIMS` at most once, joined by '-' (``dp-dp-tp`` would give dp two mesh axes)."""
    named = [d for d in str(mapping).split("-") if d]
    bad = sorted({d for d in named if d not in DIMS})
    repeated = sorted({d for d in named if named.count(d) > 1 and d in DIMS})
    if not bad and not repeated:
        return ""
    what = f"names {', '.join(repeated)} twice" if repeated else f"has {bad} (no such dimension)"
    return (
        f"{mapping!r} {what}: use each of {', '.join(DIMS)} at most once, outermost first, "
        "joined by '-', e.g. pp-dp-tp"
    )


BUILTIN_STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"dp": -1},
    "fsdp": {"dp": -1, "dp_kind": "fsdp"},
    "tp": {"tp": -1},
    "pp": {"pp": -1},
    "ep": {"ep": -1},
}


def split_layers(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous layer ranges per pipeline stage; the first stages take the remainder."""
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


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
        problems += _pipeline_problems(plan, cfg)
    return problems


def _pipeline_problems(plan: ParallelPlan, cfg: GPTConfig) -> list[str]:
    """The checks of :func:`validate_plan` that only a pipelined plan (pp > 1) needs."""
    problems = []
    if plan.pp_schedule not in PP_SCHEDULES:
        problems.append(f"pp_schedule {plan.pp_schedule!r}: use one of {PP_SCHEDULES}")
    n_stages = plan.n_stages()
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
            f"pp needs model.batch ({cfg.batch}) divisible by microbatches ({plan.microbatches})"
        )
    return problems
