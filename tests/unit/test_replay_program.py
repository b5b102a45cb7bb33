"""The replay program builder (commscope.replay) on real traces: two measured cells (DDP and
pipeline, tests/data/cells), the 8-rank DLRM execution traces (tests/data/external/param) and a
predicted seed-002 scenario (GPT-1.5B on 16 GPUs, config/config.yaml); and every bad input's
message. Pure logic: nothing runs on a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope.config import read_yaml
from commscope.contracts import DTYPE_SIZES, REPLAY_PROGRAM_COLUMNS, parse_ranks
from commscope.importers import load_trace
from commscope.replay import (
    SCALING_RULE,
    build_program,
    build_replay,
    cell_source,
    load_source,
    prediction_source,
    program_bytes,
    write_program,
)
from commscope.spec.replay import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
CELLS = ROOT / "tests" / "data" / "cells"
DLRM = ROOT / "tests" / "data" / "external" / "param" / "dlrm_pytorch_et"
SCENARIO = "gpt-1.5b-16gpu-default"


def settings(name: str = "r", source: Any = None, **kw: Any) -> ReplaySettings:
    """Replay settings with a 2 x 1 placement and 6 steps unless told."""
    entry = {"source": source or {"cell": "strategy~ddp/model~gpt-tiny"}}
    entry |= {"nodes": 2, "ranks_per_node": 1, "steps": 6} | kw
    return ReplaySettings.from_mapping(entry, name)


@pytest.fixture(scope="module")
def dlrm_ops() -> pd.DataFrame:
    """The 8 ranks' execution traces in one ops table (as import_trace concatenates them)."""
    files = sorted(DLRM.glob("dlrm_eg_*.json.gz"))
    assert len(files) == 8
    return pd.concat([load_trace(f) for f in files], ignore_index=True)


@pytest.fixture(scope="module")
def scenario_spec() -> dict[str, Any]:
    return read_yaml(ROOT / "config" / "config.yaml")["predictions"][SCENARIO]


def ops_rows(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["kind"] == "op"]


def splits(text: Any) -> list[int]:
    return [int(b) for b in text.split(",")]


def alltoall_instances(table: pd.DataFrame) -> list[dict[int, pd.Series]]:
    """Per step and group, the k-th all-to-all of every member: {rank: row}."""
    out = []
    a2a = ops_rows(table)[ops_rows(table)["op"] == "alltoall"]
    for (_, group), rows in a2a.groupby(["step", "group_ranks"]):
        by_rank = {r: g.sort_values("idx") for r, g in rows.groupby("rank")}
        assert sorted(by_rank) == parse_ranks(group)
        counts = {len(g) for g in by_rank.values()}
        assert len(counts) == 1
        for k in range(counts.pop()):
            out.append({r: g.iloc[k] for r, g in by_rank.items()})
    return out


# --------------------------------------------------------------------------- measured cells


@pytest.mark.parametrize("cell", ["ddp-2rank", "pp-2rank"])
def test_measured_cell_replays_its_steady_steps(cell: str) -> None:
    """Each replay step issues its source step's ops: same op sequence, groups, peers, roots,
    dtypes and numel, rank by rank; the set-up once, first; the columns exactly the
    contract's; ranks as launched; compute busy (the cell's compute ran on this CPU)."""
    src = cell_source(CELLS / cell)
    prog = build_replay(settings(steps=6), src)
    table, meta = prog.table, prog.meta
    assert tuple(table.columns) == REPLAY_PROGRAM_COLUMNS
    assert meta["source_steps"] == [2, 3, 4, 5]  # cell.json warmup_steps = 2
    assert meta["step_map"] == [2, 3, 4, 5, 2, 3]
    assert meta["compute"] == "busy" and meta["compute_source"] == "recorded"
    ops = src.ops
    for rank in (0, 1):
        mine = table[table["rank"] == rank]
        assert mine["idx"].tolist() == list(range(len(mine)))
        for step, source_step in [(-1, -1), *enumerate(meta["step_map"])]:
            got = mine[(mine["step"] == step) & (mine["kind"] == "op")]
            want = ops[(ops["rank"] == rank) & (ops["step"] == source_step)]
            want = want.sort_values("t_issue_ns")
            if step == -1:  # the set-up: step -1 ops before the first step
                want = want[want["t_issue_ns"] < ops.loc[ops["step"] >= 0, "t_issue_ns"].min()]
            for column in ("op", "group_ranks", "peer", "root", "dtype", "numel"):
                assert got[column].tolist() == want[column].tolist(), (rank, step, column)
            assert got["src_seq"].tolist() == want["seq"].tolist()
            if step >= 0:
                ends = mine[(mine["step"] == step) & (mine["kind"] == "step_end")]
                assert len(ends) == 1 and ends["idx"].item() == got["idx"].max() + 1
    # The bytes per step are the source's steady step's, as the ops table counts them.
    per = program_bytes(table)
    steady = ops[ops["step"] >= 2].groupby("step")["bytes"].sum()
    assert meta["bytes_per_step"] == pytest.approx(steady.mean())
    assert set(per.loc[per["step"] >= 0, "bytes"]) <= set(
        ops[ops["step"] >= 2].groupby(["rank", "step"])["bytes"].sum()
    )


@pytest.mark.parametrize("cell", ["ddp-2rank", "pp-2rank"])
def test_compute_gaps_are_step_time_minus_blocked_time(cell: str) -> None:
    """Per rank and steady step: the compute of the program's rows sums to the source step's
    duration minus the time the thread was blocked in the ops the program issues blocking
    (these traces predate the wait columns: a blocking op blocks from issue to end), within
    1 %; time_scale multiplies it."""
    src = cell_source(CELLS / cell)
    prog = build_replay(settings(steps=4), src)
    half = build_replay(settings(steps=4, time_scale=0.5), src)
    table, ops, steps = prog.table, src.ops, src.steps
    for (rank, step), rows in table[table["step"] >= 0].groupby(["rank", "step"]):
        source_step = prog.meta["step_map"][step]
        window = steps[(steps["rank"] == rank) & (steps["step"] == source_step)]
        window = window[window["phase"] == "step"].iloc[0]
        t0, t1 = int(window["t_start_ns"]), int(window["t_end_ns"])
        src_rows = ops[(ops["rank"] == rank) & (ops["step"] == source_step)]
        by_key = src_rows.set_index(["seq", "op", "peer"])
        blocking = rows[(rows["kind"] == "op") & ~rows["async_op"]]
        blocked = [
            (int(by_key.loc[key, "t_issue_ns"]), int(by_key.loc[key, "t_end_ns"]))
            for key in zip(blocking["src_seq"], blocking["op"], blocking["peer"], strict=True)
        ]
        busy = _union(blocked, t0, t1)
        compute = int((rows["pre_ns"] + rows["post_ns"]).sum())
        assert compute == pytest.approx((t1 - t0) - busy, rel=0.01), (rank, step)
        halved = half.table[(half.table["rank"] == rank) & (half.table["step"] == step)]
        assert int((halved["pre_ns"] + halved["post_ns"]).sum()) == pytest.approx(
            compute / 2, abs=len(rows)
        )
    # The set-up runs without compute.
    assert (table.loc[table["step"] == -1, ["pre_ns", "post_ns"]] == 0).all().all()


def _union(intervals: list[tuple[int, int]], t0: int, t1: int) -> int:
    total, end = 0, t0
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, t1)
        if b > a:
            total += b - a
            end = b
    return total


def test_pipeline_cell_async_ops_are_waited_before_the_step_ends() -> None:
    """The pipeline's overlapping sends are async (the next op was issued before they ended)
    and every one is named by exactly one later row of its step."""
    prog = build_replay(settings(steps=4), cell_source(CELLS / "pp-2rank"))
    table = prog.table
    assert table.loc[table["async_op"], "op"].isin(["send", "recv"]).all()
    assert table["async_op"].sum() > 0
    for (rank, step), rows in table.groupby(["rank", "step"]):
        waited = [int(w) for text in rows["waits"] if text for w in text.split(",")]
        assert sorted(waited) == sorted(rows.loc[rows["async_op"], "idx"].tolist()), (rank, step)
        for i, text in zip(rows["idx"], rows["waits"], strict=True):
            assert all(int(w) < i for w in text.split(",") if text)


def test_waits_from_the_capture_place_async_waits_and_split_compute() -> None:
    """With the capture's wait columns: an all-reduce issued at 100 and waited for over
    [400, 450] while another op (issued at 200, blocking until 300) ran in between is async,
    waited before the row issued after 400; the compute splits around the wait."""
    us = 1000
    base = {"group_ranks": "0,1", "group_size": 2, "peer": -1, "root": -1, "dtype": "float32",
            "numel": 10, "bytes": 40, "step": 0, "phase": "bwd", "split_bytes": None}  # fmt: skip
    rows = []
    for rank in (0, 1):
        rows += [
            {**base, "rank": rank, "op": "allreduce", "seq": 0, "t_issue_ns": 100 * us,
             "t_end_ns": 380 * us, "t_wait_start_ns": 400 * us, "t_wait_end_ns": 450 * us,
             "wait_ns": 50 * us},
            {**base, "rank": rank, "op": "broadcast", "root": 0, "seq": 1, "t_issue_ns": 200 * us,
             "t_end_ns": 300 * us, "t_wait_start_ns": 200 * us, "t_wait_end_ns": 300 * us,
             "wait_ns": 100 * us},
            {**base, "rank": rank, "op": "allreduce", "seq": 2, "t_issue_ns": 500 * us,
             "t_end_ns": 520 * us, "t_wait_start_ns": None, "t_wait_end_ns": None,
             "wait_ns": 0},
        ]  # fmt: skip
    steps = pd.DataFrame(
        [
            {"rank": r, "step": 0, "phase": "step", "t_start_ns": 0, "t_end_ns": 600 * us}
            for r in (0, 1)
        ]  # fmt: skip
    )
    prog = build_program(pd.DataFrame(rows), steps, settings(steps=1))
    r0 = prog.table[prog.table["rank"] == 0].set_index("idx")
    assert r0["async_op"].tolist() == [True, False, True, False]
    assert r0["waits"].tolist() == ["", "", "0", "2"]  # the wait-0 op waits at the step's end
    # pre: [0,100] compute, [100,200] compute; then [300,400] compute before the wait, [450,
    # 500] after it; the step's end: [500, 520] before the (never blocking) wait, the rest after.
    assert r0["pre_ns"].tolist() == [100 * us, 100 * us, 100 * us, 20 * us]
    assert r0["post_ns"].tolist() == [0, 0, 50 * us, 80 * us]
    assert int((r0["pre_ns"] + r0["post_ns"]).sum()) == 600 * us - 100 * us - 50 * us


# --------------------------------------------------------------------------- DLRM (8 ranks)


def test_dlrm_importer_gives_consistent_uneven_splits(dlrm_ops: pd.DataFrame) -> None:
    """All 8 execution traces load into one table of ranks 0-7; each all-to-all's splits
    are consistent: what rank j receives (bytes_out) is what every rank sends it."""
    assert sorted(dlrm_ops["rank"].unique()) == list(range(8))
    a2a = dlrm_ops[(dlrm_ops["op"] == "alltoall") & dlrm_ops["split_bytes"].notna()]
    assert a2a.groupby("rank").size().tolist() == [4] * 8
    for _, rows in a2a.groupby("seq"):  # c10d's sequence number matches across ranks
        sent = {int(r): splits(s) for r, s in zip(rows["rank"], rows["split_bytes"], strict=True)}
        for j, out in zip(rows["rank"], rows["bytes_out"], strict=True):
            assert sum(sent[i][j] for i in range(8)) == out
    uneven = a2a[a2a["split_bytes"].map(lambda s: len(set(splits(s))) > 1)]
    assert set(uneven["split_bytes"]) == {"384,896,1152,6656,2368,384,768,960"}


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_dlrm_replay_has_consistent_scaled_uneven_alltoalls(
    dlrm_ops: pd.DataFrame, scale: float
) -> None:
    """The 8-rank DLRM replay: rank i's split to j equals rank j's receive split from i in
    every all-to-all, splits are whole elements of the scaled size (at least one element of
    each non-empty split), and at scale 1 they are the trace's bytes."""
    s = settings(source={"import": "dlrm"}, nodes=4, ranks_per_node=2, steps=3, scale=scale)
    prog = build_program(dlrm_ops, None, s, world=8)
    table = prog.table
    assert prog.meta["compute"] == "sleep" and prog.meta["compute_source"] == "none"
    assert prog.meta["source_steps"] == [0]  # the ET marks no steps: one iteration
    instances = alltoall_instances(table)
    assert len(instances) == 5 * 3
    for inst in instances:
        for i, row in inst.items():
            dsize = DTYPE_SIZES[row["dtype"]]
            if row["split_bytes"] is None:
                assert all(r["split_bytes"] is None for r in inst.values())
                continue
            assert sum(splits(row["split_bytes"])) == row["numel"] * dsize
            for j, b in enumerate(splits(row["split_bytes"])):
                assert b == splits(inst[j]["recv_split_bytes"])[i]
                assert b % dsize == 0 and b > 0
    source = dlrm_ops[dlrm_ops["rank"] == 0].reset_index(drop=True)
    ops = ops_rows(table)
    step0 = ops[(ops["rank"] == 0) & (ops["step"] == 0)].reset_index(drop=True)
    assert step0["op"].tolist() == source["op"].tolist()
    for got, row in zip(step0.itertuples(), source.itertuples(), strict=True):
        dsize = DTYPE_SIZES[row.dtype]
        if isinstance(row.split_bytes, str):
            want = [max(1, int(b // dsize * scale + 0.5)) * dsize for b in splits(row.split_bytes)]
            assert splits(got.split_bytes) == want
        elif row.op == "alltoall":  # even: per-member chunks scaled
            assert got.numel == 8 * max(1, int(row.numel / 8 * scale + 0.5))
        else:
            assert got.numel == max(1, int(row.numel * scale + 0.5))
    if scale == 1.0:
        per = program_bytes(table)
        by_rank = dlrm_ops.groupby("rank")["bytes"].sum()
        assert per.groupby("rank")["bytes"].first().tolist() == by_rank.tolist()
        assert set(per["bytes"]) == {2_549_700}  # per rank and step, every rank


def test_dlrm_explicit_placement_relabels_groups_and_splits(dlrm_ops: pd.DataFrame) -> None:
    """ranks: [0, 1, 0, 1, ...] puts even trace ranks on node 0, odd on node 1: trace rank t
    runs as launched rank 2 x ... relabelled; a launched rank's splits follow its group's
    sorted order and still agree with the receivers'."""
    s = settings(source={"import": "dlrm"}, nodes=2, ranks_per_node=4, steps=1,
                 ranks=[0, 1, 0, 1, 0, 1, 0, 1])  # fmt: skip
    prog = build_program(dlrm_ops, None, s, world=8)
    launched = prog.meta["placement"]["launched_rank_of_trace_rank"]
    assert launched == [0, 4, 1, 5, 2, 6, 3, 7]
    table = prog.table
    assert set(ops_rows(table)["group_ranks"]) == {"0,1,2,3,4,5,6,7"}
    trace = dlrm_ops[(dlrm_ops["seq"] == 150)].set_index("rank")["split_bytes"]
    inst = next(i for i in alltoall_instances(table) if i[0]["src_seq"] == 150)
    for t, rank in enumerate(launched):
        want = splits(trace[t])
        got = splits(inst[rank]["split_bytes"])
        assert [got[launched[j]] for j in range(8)] == want
        for j in range(8):
            assert got[j] == splits(inst[j]["recv_split_bytes"])[rank]


# --------------------------------------------------------------------------- a prediction


def test_predicted_scenario_bytes_are_the_traffic_table_times_scale(
    scenario_spec: dict[str, Any],
) -> None:
    """GPT-1.5B on 16 GPUs, (p, t, d) = (4, 2, 2): the program's bytes per rank and step are the
    predictor's traffic table (payload bytes, receives included) x scale, up to rounding to
    whole elements; op counts are its messages."""
    from commscope.predict.scenarios import predict_scenario

    scale = 1e-3
    src = prediction_source(scenario_spec, SCENARIO)
    s = settings(source={"prediction": SCENARIO}, nodes=4, ranks_per_node=4, steps=2, scale=scale)
    prog = build_replay(s, src, memory_per_node=8 << 30)
    traffic = predict_scenario(scenario_spec, SCENARIO).traffic
    want = traffic.groupby("rank")[["messages", "bytes"]].sum()
    per = program_bytes(prog.table)
    assert sorted(per["rank"].unique()) == list(range(16))
    for (rank, step), row in per.set_index(["rank", "step"]).iterrows():
        assert step in (0, 1)
        assert row["ops"] == want.loc[rank, "messages"]
        # each op rounds to whole elements: at most half an element (2 B) each
        assert abs(row["bytes"] - want.loc[rank, "bytes"] * scale) <= row["ops"] * 2
    assert prog.meta["compute_source"] == "none"
    assert "FLOPs" in prog.meta["source"]["compute"]
    assert prog.meta["ops_per_step"] == 9784
    # P2P runs are issued together and waited before the next collective: no blocking send.
    table = prog.table
    assert table.loc[table["op"].isin(["send", "recv"]), "async_op"].all()


# --------------------------------------------------------------------------- files and API


def test_write_program_round_trips(tmp_path: Path) -> None:
    prog = build_replay(settings(steps=2), cell_source(CELLS / "ddp-2rank"))
    write_program(prog, tmp_path / "p" / "program.parquet", tmp_path / "p" / "replay.json")
    back = pd.read_parquet(tmp_path / "p" / "program.parquet")
    pd.testing.assert_frame_equal(back, prog.table, check_dtype=False)
    meta = json.loads((tmp_path / "p" / "replay.json").read_text())
    assert meta["scaling_rule"] == SCALING_RULE
    assert meta["world"] == 2 and meta["scale"] == 1.0
    assert any("warmup" in note for note in meta["not_reproduced"])


def test_load_source_dispatches_on_the_source_kind(
    tmp_path: Path, dlrm_ops: pd.DataFrame, scenario_spec: dict[str, Any]
) -> None:
    d = CELLS / "ddp-2rank"
    cell = load_source(settings(), ops=d / "ops.parquet", steps=d / "steps.parquet",
                       cell=d / "cell.json")  # fmt: skip
    assert cell.measured and cell.world == 2 and cell.warmup_steps == 2
    dlrm_ops.to_parquet(tmp_path / "ops.parquet")
    imp = load_source(settings(source={"import": "dlrm"}), ops=tmp_path / "ops.parquet")
    assert not imp.measured and imp.world == 8 and imp.steps is None
    pred = load_source(settings(source={"prediction": SCENARIO}), scenario=scenario_spec)
    assert pred.world == 16
    with pytest.raises(ValueError, match=r"replays\.r\.source\.import: 'dlrm' has no ops table"):
        load_source(settings(source={"import": "dlrm"}), ops=tmp_path / "missing.parquet")


def test_settings_from_a_cell_entry_and_source_cell_mapping() -> None:
    cell = {"strategy": "ddp", "model": "gpt-tiny", "nodes": 2, "ranks_per_node": 1,
            "bw": "none", "delay": "0ms", "jitter": "0ms", "loss": "0pct", "cc": "cubic",
            "steps": 6, "repeat": 0}  # fmt: skip
    s = ReplaySettings.for_cell("mine", {"source": {"cell": cell}, "scale": 0.5}, 2, 2, 4)
    assert s.source.ref == (
        "strategy~ddp/model~gpt-tiny/nodes~2/ranks_per_node~1/bw~none/delay~0ms/jitter~0ms/"
        "loss~0pct/cc~cubic/steps~6/repeat~0"
    )
    assert (s.world_size, s.steps, s.scale, s.compute_mode(True), s.compute_mode(False)) == (
        4, 4, 0.5, "busy", "sleep",
    )  # fmt: skip
    assert s.launched_ranks(4) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"scale": 0}, r"replays\.r\.scale=0: the size scale must be > 0"),
        ({"scale": -1.5}, r"replays\.r\.scale=-1\.5"),
        ({"time_scale": -1}, r"replays\.r\.time_scale=-1: the compute scale must be >= 0"),
        ({"compute": "spin"}, r"replays\.r\.compute='spin': use one of"),
        ({"steps": 0}, r"replays\.r\.steps=0: give a whole number >= 1"),
        ({"colour": 1}, r"replays\.r: unknown keys \['colour'\]"),
        ({"source": {"cell": "x", "import": "y"}}, r"replays\.r\.source: give exactly one"),
        ({"source": {"trace": "x"}}, r"replays\.r\.source\.trace: unknown source kind"),
        ({"source": {"cell": "not-a-cell"}}, r"replays\.r\.source\.cell: 'not-a-cell' is not"),
        ({"source": {"cell": {"strategy": "ddp"}}}, r"replays\.r\.source\.cell: give every"),
        ({"ranks": [0, 0]}, r"replays\.r\.ranks: \[0, 0\] puts \{0: 2, 1: 0\} ranks"),
        ({"ranks": [0, 5]}, r"replays\.r\.ranks: nodes \[5\] are outside 0\.\.1"),
        ({"mirror": "yes"}, r"replays\.r\.mirror='yes': give true or false"),
    ],
)
def test_bad_settings_name_the_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings(**entry)


def test_a_trace_that_does_not_fit_the_placement(dlrm_ops: pd.DataFrame) -> None:
    s = settings(source={"import": "dlrm"}, nodes=2, ranks_per_node=2)
    with pytest.raises(ValueError, match=r"replays\.r\.source: the trace has 8 ranks but the "
                       r"placement has nodes x ranks_per_node = 2 x 2 = 4; run the replay on a "
                       r"cell with nodes x ranks_per_node = 8"):  # fmt: skip
        build_program(dlrm_ops, None, s)
    s = settings(source={"import": "dlrm"}, nodes=2, ranks_per_node=4, ranks=[0, 1] * 4)
    ok = build_program(dlrm_ops, None, s)
    assert ok.world == 8


def test_missing_ranks_and_mirror(dlrm_ops: pd.DataFrame) -> None:
    """Rank 0's DLRM trace alone: refused, naming the missing ranks and mirror; mirror is
    refused too (its uneven all-to-alls receive what the other ranks send). A DDP trace of rank
    0 mirrors: every rank runs rank 0's program."""
    rank0 = dlrm_ops[dlrm_ops["rank"] == 0]
    s = settings(source={"import": "dlrm"}, nodes=8, ranks_per_node=1)
    with pytest.raises(ValueError, match=r"ranks 1-7 are missing\. Import every rank's trace, "
                       r"or set replays\.r\.mirror: true"):  # fmt: skip
        build_program(rank0, None, s)
    mirrored = settings(source={"import": "dlrm"}, nodes=8, ranks_per_node=1, mirror=True)
    with pytest.raises(ValueError, match=r"replays\.r\.mirror: rank 0's program cannot stand "
                       r"for every rank: its uneven all-to-alls \(1\) receive what the other ranks "
                       r"send"):  # fmt: skip
        build_program(rank0, None, mirrored)
    ddp = cell_source(CELLS / "ddp-2rank")
    ddp0 = ddp.ops[ddp.ops["rank"] == 0]
    with pytest.raises(ValueError, match=r"ranks 1 are missing"):
        build_program(ddp0, ddp.steps, settings(), world=2)
    prog = build_program(ddp0, ddp.steps, settings(mirror=True), world=2, warmup_steps=2)
    t = prog.table
    cols = ["idx", "op", "numel", "pre_ns", "post_ns"]
    assert t[t["rank"] == 1][cols].values.tolist() == t[t["rank"] == 0][cols].values.tolist()
    assert any("mirror" in note for note in prog.meta["not_reproduced"])


def test_ops_gloo_cannot_run_are_listed(dlrm_ops: pd.DataFrame) -> None:
    bad = dlrm_ops.copy()
    bad.loc[0, "op"] = "allreduce_sparse"
    bad.loc[1, "op"] = "recv"  # peer -1: a receive from any source
    with pytest.raises(ValueError, match=r"replays\.r\.source: the trace has ops gloo cannot "
                       r"replay: rank 0's allreduce_sparse: unknown op; rank 0's recv with peer "
                       r"-1 \(a receive from any source\?\)"):  # fmt: skip
        build_program(bad, None, settings(nodes=8), world=8)


def test_unknown_group_members_and_disagreeing_ranks(dlrm_ops: pd.DataFrame) -> None:
    bad = dlrm_ops.copy()
    bad.loc[bad["rank"] == 3, "group_size"] = 4  # a group of 4 whose ranks the trace omits
    with pytest.raises(ValueError, match=r"rank 3's alltoall on group '\d+' of 4 unknown ranks"):
        build_program(bad, None, settings(nodes=8), world=8)
    bad = dlrm_ops.copy()
    bad.loc[(bad["rank"] == 5) & (bad["seq"] == 151), "numel"] = 7
    with pytest.raises(ValueError, match=r"collective 4 on group 0-7 is allreduce of 394241 "
                       r"float32 on rank 0 but allreduce of 7 float32 on rank 5"):  # fmt: skip
        build_program(bad, None, settings(nodes=8), world=8)


def test_unpaired_p2p_is_refused() -> None:
    pp = cell_source(CELLS / "pp-2rank")
    ops = pp.ops.drop(pp.ops[(pp.ops["rank"] == 1) & (pp.ops["op"] == "recv")].index[-1])
    with pytest.raises(ValueError, match=r"rank 0 sends 4 messages to rank 1 but rank 1 "
                       r"receives 3 from rank 0"):  # fmt: skip
        build_program(ops, pp.steps, settings(), world=2, warmup_steps=2)


def test_memory_limit_names_the_scale_that_fits(scenario_spec: dict[str, Any]) -> None:
    """GPT-1.5B at full size needs GiBs of buffers per node (its 453 MB DP all-reduce x 3 x
    4 ranks): refused against 2 GiB, naming the scale that fits."""
    src = prediction_source(scenario_spec, SCENARIO)
    s = settings(source={"prediction": SCENARIO}, nodes=4, ranks_per_node=4, steps=1, scale=1)
    with pytest.raises(ValueError, match=r"replays\.r\.scale=1: node \d would need [\d.]+ GiB "
                       r"of buffers .* but has 2\.00 GiB for them; lower the scale to "
                       r"0\.\d+ or less"):  # fmt: skip
        build_replay(s, src, memory_per_node=2 << 30)
    fits = build_replay(s, src, memory_per_node=None)
    worst = max(fits.meta["memory_per_node_bytes"])
    assert worst > 2 << 30
    small = settings(source={"prediction": SCENARIO}, nodes=4, ranks_per_node=4, steps=1,
                     scale=0.9 * (2 << 30) / worst)  # fmt: skip
    assert max(build_replay(small, src, memory_per_node=2 << 30).meta["memory_per_node_bytes"]) <= (
        2 << 30
    )


def test_single_rank_imports_mirror_with_what_their_format_omits() -> None:
    """The ResNet-50 DDP execution trace of rank 1 of 2 mirrors onto rank 0 (its groups are
    the world); the HTA Kineto trace of rank 0 names no broadcast root (rooted at the group's
    first rank) and keeps its recorded gaps; PARAM's DLRM Kineto trace of rank 0 names no
    group, so its world is the placement's. Each says so in the meta."""
    ext = ROOT / "tests" / "data" / "external"
    resnet = load_trace(ext / "param" / "resnet_2gpu_et.json.gz")
    assert set(resnet["rank"]) == {1}
    prog = build_program(resnet, None, settings(mirror=True, steps=3))
    t = ops_rows(prog.table)
    cols = ["op", "numel", "dtype", "group_ranks", "root"]
    assert t[t["rank"] == 0][cols].values.tolist() == t[t["rank"] == 1][cols].values.tolist()
    assert prog.meta["source_steps"] == [4, 5, 6]
    assert "mirror: ranks 0 run rank 1's program" in " ".join(prog.meta["not_reproduced"])

    hta = load_trace(ext / "hta" / "nccl_parser_config__nccl_data.json.gz")
    prog = build_program(hta, None, settings(mirror=True, steps=3))
    t = ops_rows(prog.table)
    assert (t.loc[t["op"] == "broadcast", "root"] == 0).all()
    assert prog.meta["compute_source"] == "recorded"
    assert (t.loc[t["op"] == "allreduce", "pre_ns"] > 0).all()
    assert "rooted at their group's first rank" in " ".join(prog.meta["not_reproduced"])

    dlrm0 = load_trace(
        ext / "param" / "dlrm_kineto__worker0_step_12.1694128201545.pt.trace.json.gz"
    )
    s = settings(source={"import": "k"}, nodes=2, ranks_per_node=4, steps=1, mirror=True)
    prog = build_program(dlrm0, None, s)
    assert prog.world == 8
    assert set(ops_rows(prog.table)["group_ranks"]) == {"0,1,2,3,4,5,6,7"}
    assert "names no group" in " ".join(prog.meta["not_reproduced"])
