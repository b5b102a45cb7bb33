"""The GPT model, pipeline stage splitting, the parallel plan's mesh arithmetic and the
strategy/degree checks (no processes)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from commscope.spec.models import GPTConfig
from commscope.spec.plan import (
    BUILTIN_STRATEGIES,
    ParallelPlan,
    split_layers,
    validate_cell,
    validate_plan,
)
from commscope.workload.models import GPT, lm_loss, synthetic_batch

CFG = GPTConfig(layers=5, hidden=32, heads=2, seq=16, vocab=64, batch=4)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [
        (5, 2, [[0, 1, 2], [3, 4]]),
        (4, 4, [[0], [1], [2], [3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
        (3, 1, [[0, 1, 2]]),
        (2, 3, [[0], [1], []]),  # more stages than layers: the last stage gets nothing
    ],
)
def test_split_layers(layers: int, stages: int, expected: list[list[int]]) -> None:
    ranges = split_layers(layers, stages)
    assert [list(r) for r in ranges] == expected
    # Contiguous, covering every layer exactly once.
    assert [i for r in ranges for i in r] == list(range(layers))


def test_gpt_forward_shapes_and_parameter_count() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    x, y = synthetic_batch(CFG, CFG.batch, seed=1)
    assert x.shape == y.shape == (CFG.batch, CFG.seq)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert int(x.min()) >= 0 and int(x.max()) < CFG.vocab
    logits = model(x)
    assert logits.shape == (CFG.batch, CFG.seq, CFG.vocab)
    loss = lm_loss(logits, y)
    assert loss.shape == ()
    # Untrained: close to the uniform cross-entropy ln(vocab).
    assert abs(loss.item() - math.log(CFG.vocab)) < 0.5
    h, v, s = CFG.hidden, CFG.vocab, CFG.seq
    block = 2 * 2 * h + 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert (
        sum(p.numel() for p in model.parameters())
        == v * h + s * h + CFG.layers * block + 2 * h + h * v
    )
    # Layers are keyed by their global index.
    assert list(model.layers.keys()) == ["0", "1", "2", "3", "4"]


def test_synthetic_batch_is_reproducible() -> None:
    a, _ = synthetic_batch(CFG, 2, seed=7)
    b, _ = synthetic_batch(CFG, 2, seed=7)
    c, _ = synthetic_batch(CFG, 2, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("stages", [2, 3])
def test_pipeline_stages_chain_to_the_full_model(stages: int) -> None:
    torch.manual_seed(0)
    full = GPT(CFG).eval()
    state = full.state_dict()
    ranges = split_layers(CFG.layers, stages)
    parts = []
    for i, ids in enumerate(ranges):
        stage = GPT(CFG, ids, has_embedding=i == 0, has_head=i == stages - 1).eval()
        assert (stage.tok_emb is not None) == (i == 0)
        assert (stage.pos_emb is not None) == (i == 0)
        assert (stage.head is not None) == (i == stages - 1)
        assert (stage.norm is not None) == (i == stages - 1)
        # Parameter names are stable across stages: each stage's names are a subset of the
        # full model's, so the full weights load without renaming.
        own = stage.state_dict().keys()
        assert set(own) <= set(state)
        stage.load_state_dict({k: state[k] for k in own})
        parts.append(stage)
    # Together the stages hold every parameter exactly once.
    names = [n for p in parts for n in p.state_dict()]
    assert sorted(names) == sorted(state)

    x, _ = synthetic_batch(CFG, 2, seed=3)
    with torch.no_grad():
        expected = full(x)
        h = x
        for i, stage in enumerate(parts):
            h = stage(h)
            if i < stages - 1:
                assert h.shape == (2, CFG.seq, CFG.hidden)  # activations between stages
                assert h.dtype == torch.float32
    assert h.shape == expected.shape == (2, CFG.seq, CFG.vocab)
    torch.testing.assert_close(h, expected)


def test_a_middle_stage_is_blocks_only() -> None:
    stage = GPT(CFG, range(2, 4), has_embedding=False, has_head=False)
    assert list(stage.layers.keys()) == ["2", "3"]
    h = torch.randn(2, CFG.seq, CFG.hidden)
    assert stage(h).shape == h.shape


# ─────────────────────────────────────────────────────────── ParallelPlan: the mesh arithmetic


def _plan(world: int, **spec: Any) -> ParallelPlan:
    return ParallelPlan.from_dict(spec).resolve(world)


def _groups(plan: ParallelPlan, dim: str, world: int) -> list[list[int]]:
    """Every distinct group along ``dim``, in order of their first rank."""
    distinct = {tuple(plan.group_of(dim, r)) for r in range(world)}
    return [list(g) for g in sorted(distinct)]


def test_resolve_fills_the_free_degree() -> None:
    plan = _plan(4, dp=-1, tp=2)
    assert (plan.dp, plan.tp, plan.pp, plan.ep) == (2, 2, 1, 1)
    assert _plan(8, tp=2, pp=-1) == ParallelPlan(tp=2, pp=4)
    assert _plan(1, pp=-1).pp == 1
    # Resolving a resolved plan changes nothing; the built-ins take every rank along one dim.
    assert plan.resolve(4) == plan
    for name, dim in (("ddp", "dp"), ("fsdp", "dp"), ("tp", "tp"), ("pp", "pp"), ("ep", "ep")):
        assert getattr(_plan(4, **BUILTIN_STRATEGIES[name]), dim) == 4
    assert _plan(4, **BUILTIN_STRATEGIES["fsdp"]).dp_kind == "fsdp"


@pytest.mark.parametrize(
    ("spec", "world", "fragments"),
    [
        ({"dp": 2, "tp": 2}, 8, ["multiply to 4", "has 8 ranks", "'dp': 2", "'tp': 2"]),
        ({"dp": 3}, 4, ["multiply to 3", "has 4 ranks"]),
        ({"dp": -1, "tp": 3}, 4, ["multiply to 3", "does not divide the world size 4"]),
        ({"dp": -1, "tp": -1}, 4, ["only one degree may be -1", "'dp'", "'tp'"]),
        ({"dp": 0}, 4, ["dp=0 must be >= 1 or -1"]),
    ],
)
def test_resolve_rejects_degrees_that_do_not_fit(
    spec: dict[str, int], world: int, fragments: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        ParallelPlan.from_dict(spec).resolve(world)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_the_plan_checks_its_degrees_on_construction() -> None:
    # Like torchtitan's ParallelDims: an impossible degree fails before any world size is known.
    with pytest.raises(ValueError, match="only one degree may be -1"):
        ParallelPlan(dp=-1, pp=-1)
    with pytest.raises(ValueError, match="degree tp=0 must be >= 1 or -1"):
        ParallelPlan(tp=0)
    # Usable without a mesh: group and coordinates come from the degrees alone.
    plan = ParallelPlan(dp=2, pp=2, stages_per_rank=2, pp_schedule="interleaved-1f1b")
    assert plan.n_stages() == 4
    assert plan.stage_ids(1) == [1, 3]
    assert plan.group_of("pp", 1) == [1, 3]


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown strategy keys \['zero'\]") as info:
        ParallelPlan.from_dict({"dp": -1, "zero": 3})
    assert "microbatches" in str(info.value)  # the known keys are listed


def test_order_puts_omitted_dims_outermost() -> None:
    assert ParallelPlan().order() == ["pp", "dp", "ep", "tp"]
    assert ParallelPlan(mapping="tp-dp").order() == ["pp", "ep", "tp", "dp"]
    assert ParallelPlan(mapping="tp-dp-pp").order() == ["ep", "tp", "dp", "pp"]
    for bad in ("pp-dp-xp", "tp-tp", "pp_dp"):
        with pytest.raises(ValueError, match="at most once, outermost first"):
            ParallelPlan(mapping=bad).order()


def test_mesh_shape_leaves_out_size_one_dims() -> None:
    assert _plan(4, dp=-1).mesh_shape() == ((4,), ("dp",))
    assert _plan(1, dp=-1).mesh_shape() == ((), ())
    assert _plan(4, dp=-1, tp=2, mapping="pp-dp-tp").mesh_shape() == ((2, 2), ("dp", "tp"))
    assert _plan(4, dp=-1, tp=2, mapping="tp-dp").mesh_shape() == ((2, 2), ("tp", "dp"))
    assert _plan(8, dp=2, tp=2, pp=2).mesh_shape() == ((2, 2, 2), ("pp", "dp", "tp"))


def test_dp_tp_inside_a_node() -> None:
    # pp-dp-tp: TP innermost, so TP groups are contiguous ranks (the same node at 2 per node).
    plan = _plan(4, dp=-1, tp=2, mapping="pp-dp-tp")
    assert _groups(plan, "tp", 4) == [[0, 1], [2, 3]]
    assert _groups(plan, "dp", 4) == [[0, 2], [1, 3]]
    assert _groups(plan, "pp", 4) == [[0], [1], [2], [3]]  # unused dim: a rank alone
    assert [plan.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [plan.coords(r)["dp"] for r in range(4)] == [0, 0, 1, 1]


def test_dp_tp_across_nodes() -> None:
    # tp-dp: DP innermost, so TP pairs ranks 2 apart (one per node at 2 ranks per node).
    plan = _plan(4, dp=-1, tp=2, mapping="tp-dp")
    assert _groups(plan, "tp", 4) == [[0, 2], [1, 3]]
    assert _groups(plan, "dp", 4) == [[0, 1], [2, 3]]
    assert [plan.coords(r)["tp"] for r in range(4)] == [0, 0, 1, 1]
    assert [plan.coords(r)["dp"] for r in range(4)] == [0, 1, 0, 1]


def test_dp_tp_pp_on_eight_ranks() -> None:
    # Default mapping pp-dp-ep-tp, mesh (pp 2, dp 2, tp 2): strides 4, 2, 1.
    plan = _plan(8, dp=2, tp=2, pp=2)
    assert _groups(plan, "pp", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert _groups(plan, "dp", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert _groups(plan, "tp", 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan.coords(0) == {"pp": 0, "dp": 0, "ep": 0, "tp": 0}
    assert plan.coords(5) == {"pp": 1, "dp": 0, "ep": 0, "tp": 1}
    assert plan.coords(6) == {"pp": 1, "dp": 1, "ep": 0, "tp": 0}
    assert plan.coords(7) == {"pp": 1, "dp": 1, "ep": 0, "tp": 1}


@pytest.mark.parametrize(
    ("world", "spec"),
    [
        (4, {"dp": -1, "tp": 2}),
        (4, {"dp": -1, "tp": 2, "mapping": "tp-dp"}),
        (8, {"dp": 2, "tp": 2, "pp": 2}),
        (8, {"dp": 2, "tp": 2, "pp": 2, "mapping": "tp-dp-pp"}),
        (8, {"dp": 2, "tp": 2, "pp": 2, "mapping": "dp-tp"}),
        (12, {"dp": 3, "tp": 2, "pp": -1, "mapping": "tp-pp-dp"}),
        (8, {"ep": 4, "dp": -1}),
        (6, {"pp": 3, "tp": -1}),
    ],
)
def test_groups_match_the_device_mesh_layout(world: int, spec: dict[str, Any]) -> None:
    # init_device_mesh lays ranks out as arange(world).view(shape): the groups along dim k are
    # the mesh's lines along axis k. group_of and coords must agree without any process group.
    plan = _plan(world, **spec)
    shape, names = plan.mesh_shape()
    mesh = torch.arange(world).reshape(shape)
    for k, dim in enumerate(names):
        lines = mesh.movedim(k, -1).reshape(-1, shape[k]).tolist()
        assert _groups(plan, dim, world) == sorted(lines, key=lambda g: g[0])
        for rank in range(world):
            group = plan.group_of(dim, rank)
            assert rank in group
            # A rank's index in its group is its coordinate along that dim; the other
            # coordinates are the same across the group.
            assert group.index(rank) == plan.coords(rank)[dim]
            others = {d: c for d, c in plan.coords(rank).items() if d != dim}
            assert all(
                {d: c for d, c in plan.coords(g).items() if d != dim} == others for g in group
            )
    # Coordinates are a bijection between ranks and mesh positions.
    positions = {tuple(plan.coords(r)[d] for d in names) for r in range(world)}
    assert len(positions) == world
    for rank in range(world):
        assert int(mesh[tuple(plan.coords(rank)[d] for d in names)]) == rank


# ─────────────────────────────────────────────────────────── validate_plan / validate_cell


def _cfg(**kw: int) -> GPTConfig:
    base = {"layers": 4, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 8}
    return GPTConfig(**(base | kw))


def _builtin(name: str, microbatches: int = 4) -> ParallelPlan:
    spec = BUILTIN_STRATEGIES[name]
    if name == "pp":
        spec = spec | {"microbatches": microbatches}
    return ParallelPlan.from_dict(spec)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pp"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_validate_plan_accepts_a_fitting_model(strategy: str, world: int) -> None:
    assert validate_plan(_builtin(strategy), _cfg(), world) == []


@pytest.mark.parametrize(
    ("strategy", "cfg", "world", "microbatches", "fragments"),
    [
        ("ddp", _cfg(hidden=30), 2, 4, ["model.hidden=30", "model.heads=4"]),
        ("tp", _cfg(heads=4), 3, 4, ["tp=3 needs", "model.heads (4) divisible by 3"]),
        ("tp", _cfg(heads=2, hidden=2, ffn_mult=1), 4, 4, ["heads (2)", "MLP width"]),
        ("pp", _cfg(layers=2), 4, 4, ["pp=4 x stages_per_rank=1", "model.layers (2) >= 4 stages"]),
        ("pp", _cfg(batch=6), 2, 4, ["model.batch (6) divisible by microbatches (4)"]),
    ],
)
def test_validate_plan_names_the_problem(
    strategy: str, cfg: GPTConfig, world: int, microbatches: int, fragments: list[str]
) -> None:
    problems = validate_plan(_builtin(strategy, microbatches), cfg, world)
    text = "\n".join(problems)
    for fragment in fragments:
        assert fragment in text


def test_validate_plan_only_checks_what_the_strategy_needs() -> None:
    # Heads not divisible by the world matter to tp only; too few layers to pp only.
    assert validate_plan(_builtin("ddp"), _cfg(heads=4), 3) == []
    assert validate_plan(_builtin("fsdp"), _cfg(layers=1), 4) == []
    assert validate_plan(_builtin("tp"), _cfg(layers=1, batch=3), 2) == []
    assert len(validate_plan(_builtin("pp"), _cfg(layers=1, batch=6), 2)) == 2


@pytest.mark.parametrize(
    ("spec", "world", "fragment"),
    [
        ({"dp": -1, "dp_kind": "zero"}, 2, "dp_kind 'zero': use ddp or fsdp"),
        ({"pp": -1, "pp_schedule": "zb"}, 2, "pp_schedule 'zb'"),
        ({"pp": -1, "pp_schedule": "interleaved-1f1b"}, 2, "needs stages_per_rank >= 2"),
        ({"pp": -1, "pp_schedule": "gpipe", "stages_per_rank": 2}, 2, "set stages_per_rank 1"),
        ({"pp": -1, "microbatches": 2}, 4, "microbatches (2) >= the number of pipeline ranks (4)"),
        ({"pp": 2, "stages_per_rank": 3, "pp_schedule": "interleaved-1f1b"}, 2, ">= 6 stages"),
        ({"dp": 2, "tp": 2}, 2, "multiply to 4 but the cell has 2 ranks"),
        ({"dp": -1, "mapping": "dp-dp"}, 2, "at most once"),
    ],
)
def test_validate_plan_rejects(spec: dict[str, Any], world: int, fragment: str) -> None:
    problems = validate_plan(ParallelPlan.from_dict(spec), _cfg(), world)
    assert any(fragment in p for p in problems), problems


def test_validate_plan_schedules() -> None:
    # GPipe runs any number of micro-batches; 1F1B and interleaved need one per pipeline rank.
    assert validate_plan(ParallelPlan(pp=-1, pp_schedule="gpipe", microbatches=2), _cfg(), 4) == []
    interleaved = {"pp_schedule": "interleaved-1f1b", "stages_per_rank": 2, "microbatches": 2}
    assert validate_plan(ParallelPlan(pp=2, dp=-1, **interleaved), _cfg(), 4) == []


def test_validate_cell_checks_the_model_kind_against_the_plan() -> None:
    gpt = {"layers": 4, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 8}
    moe = gpt | {"kind": "moe", "experts": 4, "top_k": 2}
    assert validate_cell(gpt, {"dp": -1, "tp": 2}, 4) == []
    assert validate_cell(moe, {"ep": -1}, 4) == []
    assert any("needs an MoE model" in p for p in validate_cell(gpt, {"ep": -1}, 2))
    assert any("dp=1" in p for p in validate_cell(moe, {"ep": 2, "dp": 2}, 4))
    assert any(
        "divisible by the expert-parallel size" in p for p in validate_cell(moe, {"ep": -1}, 3)
    )
    vision = {"kind": "vgg16", "image": 32, "batch": 2}
    assert validate_cell(vision, {"dp": -1, "dp_kind": "fsdp"}, 2) == []
    assert any("data parallel only" in p for p in validate_cell(vision, {"pp": -1}, 2))
    # Problems of the plan itself come back as one message instead of an exception.
    assert validate_cell(gpt, {"dp": 3}, 4) == [
        "strategy degrees {'pp': 1, 'dp': 3, 'ep': 1, 'tp': 1} multiply to 3 but the cell has 4 "
        "ranks (nodes x ranks_per_node); set one degree to -1 or change the cell"
    ]
    assert "unknown strategy keys" in validate_cell(gpt, {"dpp": 2}, 2)[0]
