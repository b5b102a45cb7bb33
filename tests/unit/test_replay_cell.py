"""A replay cell against its program (commscope.replay.cell): op by op, per rank and steady
step, and the timing row against the source's step on the same link."""

from __future__ import annotations

import math

import pandas as pd

from commscope.replay.cell import compare_program, replay_timing


def _program() -> pd.DataFrame:
    rows = []
    for rank in (0, 1):
        idx = 0
        for step in (0, 1, 2):
            for op, numel in (("allreduce", 10), ("broadcast", 4)):
                rows.append(
                    dict(rank=rank, idx=idx, kind="op", step=step, phase="bwd", op=op,
                         dtype="float32", numel=numel, group_ranks="0,1", peer=-1,
                         root=0 if op == "broadcast" else -1, split_bytes=None)
                )  # fmt: skip
                idx += 1
            rows.append(
                dict(rank=rank, idx=idx, kind="step_end", step=step, phase="step", op="",
                     dtype="", numel=0, group_ranks="", peer=-1, root=-1, split_bytes=None)
            )  # fmt: skip
            idx += 1
    return pd.DataFrame(rows)


def _measured(program: pd.DataFrame) -> pd.DataFrame:
    ops = program[program["kind"] == "op"].copy()
    ops["bytes"] = ops["numel"] * 4
    ops["seq"] = ops["idx"]
    ops["t_issue_ns"] = ops["idx"] * 1000
    return ops


def test_a_faithful_replay_matches_op_by_op() -> None:
    program = _program()
    out = compare_program(program, _measured(program), warmup_steps=1)
    assert sorted(out["step"].unique()) == [1, 2]
    assert out[["match", "sizes_match", "sequence_match"]].all().all()
    assert out["predicted_bytes"].sum() == out["measured_bytes"].sum() == 2 * 2 * (40 + 16)


def test_a_reordered_or_resized_op_is_caught() -> None:
    program = _program()
    swapped = _measured(program)
    # Rank 1 issues step 2's two ops in the other order: totals agree, the sequence does not.
    sel = (swapped["rank"] == 1) & (swapped["step"] == 2)
    swapped.loc[sel, "t_issue_ns"] = swapped.loc[sel, "t_issue_ns"].to_numpy()[::-1]
    out = compare_program(program, swapped, warmup_steps=1)
    bad = out[~out["sequence_match"]]
    assert set(zip(bad["rank"], bad["step"], strict=True)) == {(1, 2)}
    assert out["match"].all()
    resized = _measured(program)
    resized.loc[resized.index[0], "bytes"] = 44  # rank 0, step 0: a warmup step, not compared
    resized.loc[(resized["rank"] == 0) & (resized["step"] == 1), "bytes"] += 4
    out = compare_program(program, resized, warmup_steps=1)
    assert set(out.loc[~out["match"], "step"]) == {1}


def test_timing_compares_with_the_source_only_on_its_own_link() -> None:
    steps = pd.DataFrame(
        [
            dict(rank=r, step=s, phase="step", t_start_ns=s * 10**9, t_end_ns=s * 10**9 + 2 * 10**8)
            for r in (0, 1)
            for s in range(4)
        ]  # fmt: skip
    )
    ops = pd.DataFrame(columns=["rank", "step", "t_issue_ns", "t_end_ns"])
    link = dict(bw="none", delay="0ms", jitter="0ms", loss="0pct", cc="cubic", nodes=2,
                ranks_per_node=1)  # fmt: skip
    meta = {"source_step_s": 0.25, "time_scale": 1.0, "source_cell": link,
            "compute_source": "recorded"}  # fmt: skip
    same = replay_timing(meta, link, ops, steps, warmup_steps=2).iloc[0]
    assert same["predicted_step_s"] == 0.25 and math.isclose(same["measured_step_s"], 0.2)
    assert math.isclose(same["time_error"], (0.25 - 0.2) / 0.2)
    other = replay_timing(meta, {**link, "bw": "50mbit"}, ops, steps, warmup_steps=2).iloc[0]
    assert math.isnan(other["predicted_step_s"]) and math.isnan(other["time_error"])
    assert other["compute_source"] == "replay: recorded compute"
