"""What the predictor and the replays say, and how far the measurements check out: the mapping
of predicted jobs, replays against their programs and sources, the wire against the recorded
ops and the prediction against the trace."""

from __future__ import annotations

import pandas as pd

from commscope.contracts import is_replay
from commscope.report.findings._base import (
    COMPARE,
    CROSSCHECK,
    PREDICTIONS,
    REPLAY,
    SENSITIVITY,
    TIMING,
    Finding,
    host_limited_cells,
    kept,
    left_out,
    lost_in,
)
from commscope.report.results import StudyResults
from commscope.spec.link import SHAPING
from commscope.units import fmt_bytes


def mapping_findings(results: StudyResults) -> list[Finding]:
    """Predicted jobs that differ only in their rank mapping: the bytes each sends across
    nodes per step and which traffic kinds cross (the scenario table's ``all`` row and its
    per-kind rows)."""
    predictions = results.table("predictions")
    keys = ["model", "pp", "tp", "dp", "ep", "world_size", "gpus_per_node"]
    if predictions.empty or any(k not in predictions for k in [*keys, "mapping", "traffic"]):
        return []
    total = predictions[predictions["traffic"] == "all"]
    kinds = predictions[(predictions["traffic"] != "all") & (predictions["inter_node_bytes"] > 0)]
    out = []
    for key, group in total.groupby(keys, sort=True):
        if group["mapping"].nunique() < 2:
            continue
        group = group.sort_values(["inter_node_bytes", "mapping"])
        row = dict(zip(keys, key, strict=True))
        said = []
        for rec in group.to_dict("records"):
            crossing = sorted(set(kinds[kinds["scenario"] == rec["scenario"]]["traffic"]))
            said.append(
                f"{rec['mapping']} sends {fmt_bytes(rec['inter_node_bytes'])} across nodes "
                f"({', '.join(crossing) or 'nothing'} crossing)"
            )
        low, high = group["inter_node_bytes"].iloc[0], group["inter_node_bytes"].iloc[-1]
        ratio = f"{high / low:.1f}x" if low > 0 else "all of it"
        out.append(
            Finding(
                f"The mapping decides what crosses nodes (predicted, {row['model']} on "
                f"{int(row['world_size'])} GPUs, {int(row['gpus_per_node'])} per node, "
                f"(p, t, d) = ({int(row['pp'])}, {int(row['tp'])}, {int(row['dp'])})): "
                f"{'; '.join(said)} per step; the difference is {ratio}.",
                PREDICTIONS,
                question="placement and scale",
                source="predicted",
            )
        )
    return out


def replay_findings(results: StudyResults) -> list[Finding]:
    """Replays (docs/replay.md): how faithfully the cells re-issued their programs (every
    message and byte; the step time against the source's on the source's own link), and how
    each replayed trace's step slows under the study's tightest cap and largest delay next to
    the training strategies' at the same setting."""
    comparison, timing = results.comparison, results.timing
    slowdown, _ = kept(results, "slowdown")
    # A host-limited replay's step time is the host's: its timing and slowdown are left out.
    limited = host_limited_cells(results)
    dropped = 0
    if limited and "cell" in timing and "strategy" in timing:
        out_cells = timing["cell"].astype(str).isin(limited) & is_replay(timing)
        dropped = int(timing.loc[out_cells, "cell"].nunique())
        timing = timing[~out_cells]
    out = []
    if "strategy" in comparison and "exact" in comparison:
        rep = comparison[is_replay(comparison)]
        if len(rep):
            cells = rep.groupby("cell")["exact"].all()
            text = (
                f"Replays re-issued their programs message for message and byte for byte in "
                f"{int(cells.sum())} of {len(cells)} replay cells"
            )
            same = (
                timing[is_replay(timing) & timing["time_error"].notna()]
                if "time_error" in timing
                else pd.DataFrame()
            )
            if len(same):
                # time_error is (source - replay) / replay: say replay / source instead.
                ratio = (1.0 / (1.0 + same["time_error"])).groupby(same["model"]).mean()
                parts = ", ".join(f"{m} {r:.2f}x" for m, r in ratio.sort_index().items())
                text += (
                    f"; on their source's own link a replayed step took {ratio.min():.2f}-"
                    f"{ratio.max():.2f}x the source's ({parts}; one run each)"
                )
            text += left_out(dropped)
            out.append(Finding(text + ".", REPLAY, question="checks", source="replayed"))
    if slowdown.empty or "strategy" not in slowdown:
        return out
    rows = slowdown[slowdown["slowdown_mean"].notna()]
    for varied, pick in (("bw", "min"), ("delay", "max")):
        column = SHAPING[varied]
        at_varied = rows[rows["varied"] == varied]
        replayed = at_varied[is_replay(at_varied)]
        for name, group in replayed.groupby("model", sort=True):
            value = group[column].min() if pick == "min" else group[column].max()
            mine_rows = group[group[column] == value]
            mine = mine_rows["slowdown_mean"].mean()
            others = at_varied[~is_replay(at_varied) & (at_varied[column] == value)]
            # Only the workloads on the replay's own cluster (nodes x ranks): no average over
            # unlike setups.
            place = [c for c in ("nodes", "ranks_per_node") if c in others and c in mine_rows]
            for col in place:
                others = others[others[col].isin(set(mine_rows[col]))]
            where = (
                f" on {int(mine_rows['nodes'].iloc[0])}x{int(mine_rows['ranks_per_node'].iloc[0])}"
                if len(place) == 2
                else ""
            )
            setting = (
                f"a cap of {value / 1e6:g} Mbit/s"
                if varied == "bw"
                else f"a one-way delay of {value:g} ms"
            )
            bare = "compute_source" in timing and (
                timing[(timing.get("model") == name)]["compute_source"]
                .astype(str)
                .str.contains("no compute")
                .any()
            )
            text = (
                f"The replayed trace {name}"
                + (
                    " (its communication back to back: the source records no compute)"
                    if bare
                    else ""
                )
                + f" takes {mine:.2f}x as long under {setting}{where}"
            )
            if len(others):
                per = others.groupby(["strategy", "model"])["slowdown_mean"].mean().sort_values()
                text += "; our own workloads at the same setting and cluster: " + ", ".join(
                    f"{s} ({m}) {v:.2f}x" for (s, m), v in per.items()
                )
            text += left_out(lost_in(results, strategy=f"replayed {name}"))
            out.append(Finding(text + ".", SENSITIVITY, question="sensitivity", source="replayed"))
    return out


def check_findings(results: StudyResults) -> list[Finding]:
    """How far the measurements check out: wire vs recorded ops, prediction vs trace."""
    crosscheck, matrix_check = results.table("crosscheck"), results.table("matrix_check")
    comparison, timing = results.comparison, results.timing
    out = []
    # Replay cells are checked against their programs (replay_findings), not the model.
    if "strategy" in comparison:
        comparison = comparison[~is_replay(comparison)]
    if "strategy" in timing:
        timing = timing[~is_replay(timing)]
    if not crosscheck.empty and "passed" in crosscheck:
        text = (
            f"The wire carried what the ranks recorded: {int(crosscheck['passed'].sum())} of "
            f"{len(crosscheck)} node directions"
        )
        if not matrix_check.empty and "passed" in matrix_check:
            text += f" and {int(matrix_check['passed'].sum())} of {len(matrix_check)} node pairs"
        out.append(
            Finding(
                text + " agree within their stated tolerance.",
                CROSSCHECK,
                question="checks",
                source="check",
            )
        )
    if not comparison.empty and "exact" in comparison:
        cells = comparison.groupby("cell")["exact"].all()
        out.append(
            Finding(
                f"The analytical model predicted every message and byte exactly in "
                f"{int(cells.sum())} of {len(cells)} cells.",
                COMPARE,
                question="checks",
                source="check",
            )
        )
    # The measured step time of a host-limited cell is the host's, not the network's.
    limited = host_limited_cells(results)
    dropped = 0
    if limited and "cell" in timing:
        out_cells = timing["cell"].astype(str).isin(limited)
        dropped = int(timing.loc[out_cells, "cell"].nunique())
        timing = timing[~out_cells]
    if not timing.empty and "time_error" in timing:
        err = timing["time_error"].abs().dropna()
        if len(err):
            out.append(
                Finding(
                    f"The alpha-beta step time is within {100 * err.median():.0f} % of the "
                    f"measured one for the median cell (worst {100 * err.max():.0f} %, "
                    f"{len(err)} cells){left_out(dropped)}.",
                    TIMING,
                    question="checks",
                    source="check",
                )
            )
    return out
