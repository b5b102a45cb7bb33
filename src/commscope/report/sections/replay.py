"""Replays (docs/replay.md): per replay cell, how faithfully it re-issued its program and how its
step compares with its source's. The cells and their descriptions (``replay/replay.json``) come
from the cells' statuses, by cell id."""

from __future__ import annotations

import pandas as pd

from commscope.contracts import is_replay
from commscope.report.results import StudyResults
from commscope.report.sections._base import Section


def _described(results: StudyResults) -> pd.DataFrame:
    """Each replay cell's description (its ``replay_meta``), with its cell id."""
    return pd.DataFrame(
        [{**meta, "cell": cell} for cell, meta in results.cell_json("replay_meta").items()]
    )


def replay_intro(results: StudyResults) -> str:
    """How to read the replay table, with the scaling rule each replay recorded."""
    metas = results.cell_json("replay_meta").values()
    rules = sorted({meta.get("scaling_rule", "") for meta in metas} - {""})
    return (
        "Each replay cell re-issues a source trace's communication (a measured cell, an imported "
        "trace or a predicted job) on the cluster, rank by rank in the trace's order, on its "
        "process groups, with its sizes x scale and its compute gaps x time scale, and is "
        "measured like a training cell (docs/replay.md). exact: every message and byte of "
        "every rank and steady step as the program says, in the same order. vs source: the "
        "step time against the source's, where the replay ran on the source's own link and "
        "placement. " + " ".join(rules)
    )


def replay_section(results: StudyResults) -> pd.DataFrame:
    """One row per replay cell: the replay, its source and placement, scale, link, messages
    and bytes per steady step, whether they matched the program exactly, the measured step and
    how it compares with the source's (``time_error``, same link only)."""
    if not results.cell_json("replay_meta"):
        return pd.DataFrame()
    described = _described(results)
    table = results.comparison
    rep = table[is_replay(table)] if "strategy" in table else table
    if rep.empty:
        return pd.DataFrame()
    per_cell = rep.groupby("cell", as_index=False).agg(
        msgs_per_step=("measured_msgs", "sum"),
        bytes_per_step=("measured_bytes", "sum"),
        exact=("exact", "all"),
    )
    times = results.timing
    times = times[is_replay(times)][
        ["cell", "model", "nodes", "ranks_per_node", "bw", "delay", "loss", "measured_step_s",
         "predicted_step_s", "time_error"]
    ]  # fmt: skip
    out = per_cell.merge(times, on="cell").merge(
        described[["cell", *[c for c in ("source_text", "scale", "time_scale", "compute")
                             if c in described]]],
        on="cell",
        how="left",
    )  # fmt: skip
    out = out.rename(columns={"model": "replay", "predicted_step_s": "source_step_s"})
    cols = ["replay", "source_text", "nodes", "ranks_per_node", "scale", "time_scale",
            "compute", "bw", "delay", "loss", "msgs_per_step", "bytes_per_step", "exact",
            "measured_step_s", "source_step_s", "time_error"]  # fmt: skip
    return (
        out[[c for c in cols if c in out]]
        .sort_values(["replay", "bw", "delay"])
        .reset_index(drop=True)
    )


# Shown when the study has replay cells that ran.
SECTION = Section(
    "Replays: traces re-issued on the cluster",
    replay_intro,
    replay_section,
    lambda results: bool(results.cell_products("replay_meta")),
)
