"""commscope.predict at scale: one emulated rank per role (commscope.predict.roles) gives the
same op table, rank x rank matrix and per-rank summary as emulating every rank, to the last
bit; the node grid and its terminal summary; the preset's precision (seed 002 trains fp16).

The reference here is the emulator run rank by rank, and the generic builders
(collectives.matrix, predict.compare.summarize) run on its table: what predict_scenario did
before the roles.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from commscope.collectives import matrix as generic
from commscope.contracts import with_params
from commscope.predict import cli
from commscope.predict import ops as predict_ops_module
from commscope.predict.compare import summarize
from commscope.predict.matrix import (
    node_grid,
    node_matrix_summary,
    rank_matrix,
    step_rank_matrix,
)
from commscope.predict.ops import (
    PRED_COLUMNS,
    TRAFFIC_TYPES,
    predict_ops,
    predict_step,
    resolve_plan,
)
from commscope.predict.options import PredictOptions
from commscope.predict.roles import LITERAL, GroupRef, Mesh, build_roles
from commscope.predict.scenarios import (
    PRESET_DTYPE_BYTES,
    TRAFFIC_COLUMNS,
    predict_scenario,
    step_summary,
)
from commscope.spec.models import VISION_KINDS, model_config
from commscope.spec.plan import ParallelPlan

TINY = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
MOE = TINY | {"kind": "moe", "layers": 2, "experts": 4, "top_k": 1}
MEGATRON = PredictOptions(framework="megatron")
# (model, plan, nodes, ranks per node, dtype bytes, options, backend): every branch of the
# emulator (torch and Megatron GPT, DDP / replicate / FSDP with and without a pipeline, the
# three schedules, MoE with and without EP, ResNet's buffer broadcasts) under both backends'
# traffic models, including groups of 3 (2(n-1)/n S is not a whole number of bytes).
CASES: dict[str, tuple[Any, ...]] = {
    "megatron-ptd": (
        TINY, {"pp": 2, "tp": 2, "dp": 2, "microbatches": 4}, 4, 2, 2, MEGATRON, "nccl",
    ),
    "fsdp-pp-tp-across": (
        TINY, {"pp": 2, "tp": 2, "dp": 2, "mapping": "tp-dp-pp", "dp_kind": "fsdp"}, 2, 4, 4,
        None, "gloo",
    ),
    "fsdp-no-pipeline": (TINY, {"dp": 4, "dp_kind": "fsdp"}, 2, 2, 4, None, "gloo"),
    "ddp-odd-group": (TINY, {"dp": 3}, 3, 1, 4, None, "gloo"),
    "replicate-tp": (TINY, {"dp": 3, "tp": 2}, 3, 2, 4, None, "nccl"),
    "interleaved": (
        TINY, {"pp": 2, "dp": 3, "pp_schedule": "interleaved-1f1b", "stages_per_rank": 2,
               "microbatches": 4}, 3, 2, 4, None, "nccl",
    ),
    "gpipe-megatron-odd-dp": (
        TINY, {"pp": 2, "dp": 3, "tp": 2, "pp_schedule": "gpipe"}, 3, 4, 2, MEGATRON, "gloo",
    ),
    "moe-ep": (MOE, {"ep": 4}, 2, 2, 4, None, "gloo"),
    "moe-dp": (MOE, {"dp": 4}, 2, 2, 4, None, "nccl"),
    "resnet50-broadcast-chain": (
        {"kind": "resnet50", "batch": 2}, {"dp": 3}, 3, 1, 4, None, "nccl",
    ),
}  # fmt: skip


def _per_rank(
    model: dict, plan: dict, nodes: int, rpn: int, dtype_bytes: int, options: Any, backend: str
) -> pd.DataFrame:
    """The op table as the emulator gives it rank by rank (the path before the roles)."""
    o = (options or PredictOptions()).resolve()
    kind = model.get("kind", "gpt")
    resolved = resolve_plan(model, plan, nodes * rpn)
    ctx = predict_ops_module._Ctx(kind, model_config(model), resolved, o, nodes, rpn, dtype_bytes)
    m = predict_ops_module
    gen = m._vision_rank if kind in VISION_KINDS else m._moe_rank if kind == "moe" else m._gpt_rank
    rows: list[tuple] = []
    flops = {}
    for r in range(nodes * rpn):
        got, flops[r] = gen(ctx, r)
        rows += got
    out = pd.DataFrame(rows, columns=PRED_COLUMNS)
    out.attrs["predict"] = {"flops": flops, "backend": backend, "ranks_per_node": rpn}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_roles_give_the_per_rank_tables_bit_for_bit(case: str) -> None:
    model, plan, nodes, rpn, dtype_bytes, options, backend = CASES[case]
    want = _per_rank(model, plan, nodes, rpn, dtype_bytes, options, backend)
    step = predict_step(model, plan, nodes, rpn, dtype_bytes, options, backend)
    got = step.frame()
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.attrs["predict"]["flops"] == want.attrs["predict"]["flops"]
    assert step.n_ops() == len(want)
    # Fewer emulated ranks than ranks wherever ranks share a role.
    assert len(step.roles) < nodes * rpn or case.startswith("moe-ep")
    # The traffic model's matrix and the summary, from the roles, as from the whole table.
    want.attrs["predict"] = got.attrs["predict"]
    pd.testing.assert_frame_equal(step_rank_matrix(step), rank_matrix(want), check_exact=True)
    pd.testing.assert_frame_equal(step_summary(step), summarize(want), check_exact=True)


def test_a_broadcast_chain_splits_a_role_by_what_ranks_send() -> None:
    """NCCL's broadcast chain: the root's previous rank forwards nothing, so its summary
    differs from the other two members' and it stands for itself."""
    model, plan, nodes, rpn, dtype_bytes, options, backend = CASES["resnet50-broadcast-chain"]
    step = predict_step(model, plan, nodes, rpn, dtype_bytes, options, backend)
    assert [c.tolist() for c in step.sent_classes(backend)] == [[0, 1], [2]]


def test_predict_ops_limits_rows_to_the_ranks_asked_for() -> None:
    model, plan, nodes, rpn, dtype_bytes, options, _ = CASES["megatron-ptd"]
    whole = predict_ops(model, plan, nodes, rpn, dtype_bytes, options)
    some = predict_ops(model, plan, nodes, rpn, dtype_bytes, options, ranks=[5, 2, 5])
    want = whole[whole["rank"].isin([2, 5])].reset_index(drop=True)
    pd.testing.assert_frame_equal(some, want, check_exact=True)
    assert sorted(some.attrs["predict"]["flops"]) == [2, 5]
    with pytest.raises(ValueError, match="ranks must be in"):
        predict_ops(model, plan, nodes, rpn, dtype_bytes, options, ranks=[8])


def test_a_role_that_breaks_the_symmetry_is_emulated_rank_by_rank() -> None:
    """The check, not the assumption: a rank whose ops differ from its role's relabelled
    template (here: rank 3 issues one more op) and a peer outside its op's group both make
    the role's ranks emulated one by one, with the same rows as emulated."""
    plan = ParallelPlan(dp=4)
    calls: list[int] = []

    def rank_ops(rank: int) -> tuple[list[tuple], float]:
        calls.append(rank)
        group = "0,1,2,3"
        row = (rank, rank // 2, rank % 2, 0, "bwd", "allreduce", "dp", group, 4, -1, -1,
               "float32", 10, 40, 40, 0, 0)  # fmt: skip
        extra = [(*row[:3], 1, *row[4:])] if rank == 3 else []
        return [row, *extra], 1.0

    step = build_roles(plan, 4, 2, rank_ops, PRED_COLUMNS)
    assert [r.ranks.tolist() for r in step.roles] == [[0], [1], [2], [3]]
    assert sorted(set(calls)) == [0, 1, 2, 3]
    assert step.frame()["seq"].tolist() == [0, 0, 0, 0, 1]

    def outside_peer(rank: int) -> tuple[list[tuple], float]:
        row = (rank, 0, rank, 0, "fwd", "send", "pp", f"{rank}", 1, 9, -1,
               "float32", 1, 4, 4, 0, 0)  # fmt: skip
        return [row], 0.0

    step = build_roles(ParallelPlan(dp=2), 2, 2, outside_peer, PRED_COLUMNS)
    assert all(r.refs is None for r in step.roles)
    assert step.frame()["peer"].tolist() == [9, 9]
    sends = step.sends()
    assert sends[["src_rank", "dst_rank", "bytes"]].values.tolist() == [[0, 9, 4.0], [1, 9, 4.0]]


def test_mesh_groups_match_the_plan() -> None:
    plan = ParallelPlan(pp=2, dp=3, tp=2, mapping="pp-dp-tp")
    mesh = Mesh(plan, 12)
    ranks = np.arange(12)
    for dim in ("pp", "dp", "tp"):
        ref = GroupRef(dim)
        got = mesh.members(ref, ranks).tolist()
        assert got == [plan.group_of(dim, r) for r in range(12)]
        assert mesh.index_in(ref, ranks).tolist() == [plan.coords(r)[dim] for r in range(12)]
        assert mesh.texts(ref, ranks).tolist() == [
            ",".join(map(str, plan.group_of(dim, r))) for r in range(12)
        ]
    # The first and last stage of a rank's pipeline (the tied-embedding group) is part of
    # its pp group; a group of no mesh dimension is literal.
    assert mesh.ref_of([1, 7], 7) == GroupRef("pp")
    assert mesh.ref_of(list(range(12)), 0) == GroupRef(LITERAL, tuple(range(12)))
    plan3 = ParallelPlan(pp=3, dp=2)
    assert Mesh(plan3, 6).ref_of([1, 5], 3) == GroupRef("pp", (0, 2))


@pytest.mark.parametrize("by", [["traffic"], []])
def test_node_grid_is_the_reindexed_grid(by: list[str]) -> None:
    model, plan, nodes, rpn, dtype_bytes, options, backend = CASES["megatron-ptd"]
    ranks = step_rank_matrix(predict_step(model, plan, nodes, rpn, dtype_bytes, options, backend))
    for extra_nodes in (0, nodes + 2):  # a node that sends nothing still gets its row
        want = generic.node_matrix(ranks, extra_nodes, by)
        pd.testing.assert_frame_equal(node_grid(ranks, extra_nodes, by), want, check_exact=True)
    empty = ranks.iloc[:0]
    pd.testing.assert_frame_equal(node_grid(empty, 3, by), generic.node_matrix(empty, 3, by))


def test_scenario_tables_are_those_of_the_whole_op_table() -> None:
    """predict_scenario's tables against the generic builders on its full op table (the
    former implementation): seed 002's GPT-1.5B on 16 GPUs, customized mapping."""
    spec = {"preset": "gpt-1.5b", "pp": 4, "tp": 2, "dp": 2, "mapping": "dp-pp-tp"}
    pred = predict_scenario(spec, "s")
    params = pred.scenario.params()
    ops = pred.ops
    assert len(ops) == pred.meta["ops"]
    ranks = rank_matrix(ops)
    pd.testing.assert_frame_equal(pred.rank_matrix, with_params(params, ranks), check_exact=True)
    nodes = generic.node_matrix(ranks, pred.scenario.nodes, by=["traffic"])
    pd.testing.assert_frame_equal(pred.node_matrix, with_params(params, nodes), check_exact=True)
    sparse = nodes[nodes["bytes"] > 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(pred.node_pairs(), sparse, check_exact=True)
    local = ranks["src_node"] == ranks["dst_node"]
    split = (
        ranks.assign(
            intra_node_bytes=ranks["bytes"].where(local, 0.0),
            inter_node_bytes=ranks["bytes"].where(~local, 0.0),
        )
        .groupby(["src_rank", "traffic"], as_index=False)[["intra_node_bytes", "inter_node_bytes"]]
        .sum()
        .rename(columns={"src_rank": "rank"})
    )
    traffic = summarize(ops).merge(split, on=["rank", "traffic"], how="left").fillna(0.0)
    traffic["traffic"] = pd.Categorical(traffic["traffic"], categories=TRAFFIC_TYPES)
    traffic = traffic.sort_values(["rank", "traffic"]).reset_index(drop=True)
    traffic["traffic"] = traffic["traffic"].astype(str)
    want = with_params(params, traffic)[TRAFFIC_COLUMNS]
    pd.testing.assert_frame_equal(pred.traffic, want, check_exact=True)
    assert set(pred.phases) == {"plan", "roles", "tables"}


def test_a_thousand_gpus_emulate_a_few_ranks() -> None:
    """GPT-3B on 1,024 GPUs, (4, 2, 128): four roles (one per stage), each emulated twice
    (template and check), instead of 1,024 emulated ranks."""
    t0 = time.perf_counter()
    pred = predict_scenario({"preset": "gpt-3b", "pp": 4, "tp": 2, "dp": 128}, "big")
    assert time.perf_counter() - t0 < 20  # ~1 s on a free core; generous for a loaded CI
    assert [len(r.ranks) for r in pred.step.roles] == [256] * 4
    per_stage = 2 * 128  # tp x dp ranks run each stage
    tp = 8 * ((14 * 6 + 1) + 14 * 6 + 13 * 6 + (13 * 6 + 4))  # micro-batches x all-reduces
    pp = 8 * (2 + 4 + 4 + 2)  # micro-batches x sends and receives (end stages: one side)
    dp, emb = 4, 2  # one DeepSpeed buffer per stage; the first and last stage's embedding
    assert pred.meta["ops"] == per_stage * (tp + pp + dp + emb)
    r0 = pred.traffic[pred.traffic["rank"] == 0].set_index("traffic")
    assert r0.loc["tp", "sizes"] == "131072000x680"  # the 32-GPU rank 0, whatever d is
    assert pred.node_matrix["src_node"].nunique() == 128


def test_node_matrix_summary_by_hand() -> None:
    """Three nodes: node 0 keeps 10 B inside and sends 4 B of tp and 1 B of pp to node 1;
    node 2 sends 3 B of dp to node 0."""
    rows = [(0, 0, "tp", 10.0), (0, 1, "tp", 4.0), (0, 1, "pp", 1.0), (2, 0, "dp", 3.0)]
    nm = pd.DataFrame(rows, columns=["src_node", "dst_node", "traffic", "bytes"])
    nm = generic.node_matrix(
        nm.assign(src_rank=nm["src_node"], dst_rank=nm["dst_node"]), 3, by=["traffic"]
    )
    s = node_matrix_summary(nm, top=1)
    assert (s.pairs, s.busiest_node, s.busiest_egress) == (2, 0, 5.0)
    split = s.split.set_index("traffic")
    assert split.loc["all", "intra_node_bytes"] == 10 and split.loc["all", "inter_node_bytes"] == 8
    assert split.loc["all", "inter_node_share"] == pytest.approx(8 / 18)
    assert split.loc["dp", "inter_node_share"] == 1.0 and split.loc["tp", "intra_node_bytes"] == 10
    assert s.top_pairs.to_dict("records") == [
        {"src_node": 0, "dst_node": 1, "tp": 4.0, "pp": 1.0, "dp": 0.0, "all": 5.0}
    ]
    # The sparse pairs (what the command summarizes) say the same as the complete grid.
    sparse = node_matrix_summary(nm[nm["bytes"] > 0], top=1)
    pd.testing.assert_frame_equal(sparse.split, s.split)
    pd.testing.assert_frame_equal(sparse.top_pairs, s.top_pairs)
    quiet = node_matrix_summary(nm.assign(bytes=0.0))
    assert (quiet.pairs, quiet.busiest_node, len(quiet.top_pairs)) == (0, -1, 0)


def test_cli_summarizes_a_node_matrix_too_wide_to_print(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """16 nodes: the summary (inside vs across, busiest node, top pairs), no 16-column grid."""
    args = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "64"]
    args += ["--batch", "4", "--pp", "4", "--dp", "4", "--gpus-per-node", "1", "--top", "3"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "16 nodes x 1 GPUs; 40 of 240 ordered node pairs exchange bytes" in out
    assert "inside nodes 0 B" in out and "(100.00% of the sent bytes)" in out
    assert "node pairs across nodes, top 3 by bytes:" in out
    assert "row = source" not in out  # no grid
    lines = out.split("top 3 by bytes:\n")[1].splitlines()
    assert lines[0].split() == ["src", "node", "dst", "node", "bytes", "pp", "dp"]
    assert len(lines) == 4


def _dtype_of(argv: list[str]) -> int:
    return cli.scenario_spec(cli.build_parser().parse_args(argv))[1]["dtype_bytes"]


def test_presets_take_the_papers_precision(tmp_path: Any, capsys: Any) -> None:
    """Seed 002 trains in fp16 (§5.1): a preset's messages are 2-byte unless --dtype-bytes
    says otherwise; a model given by its shape keeps fp32 (commscope's trainer), as do the
    config's cells; an explicit --dtype-bytes wins, over a config scenario's too."""
    preset = ["--preset", "gpt-3b", "--pp", "4", "--tp", "2", "--dp", "4"]
    assert PRESET_DTYPE_BYTES == 2
    assert _dtype_of(preset) == 2
    assert _dtype_of([*preset, "--dtype-bytes", "4"]) == 4
    assert _dtype_of(["--layers", "2", "--hidden", "8"]) == 4
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"predictions": {"p": {"preset": "gpt-3b", "pp": 4}}}))
    scenario = ["--config", str(config), "--scenario", "p"]
    assert "dtype_bytes" not in cli.scenario_spec(cli.build_parser().parse_args(scenario))[1]
    assert _dtype_of([*scenario, "--dtype-bytes", "4"]) == 4
    # The README's Table 3 example: rank 0's TP all-reduces carry 2bsh = 131,072,000 B.
    assert cli.main([*preset, "--gpus-per-node", "8", "--framework", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "2-byte dtype" in out and "131072000x680" in out and "262144000" not in out
