"""The report's table sections, each computed from the study's result files.

Every function returns a tidy DataFrame for :func:`commscope.report.render_report`'s ``tables``;
none holds a number of its own. Missing inputs (a stage turned off) give empty frames, which the
report shows as "no rows".
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.metrics import crosscheck_by_strategy


def _read(path: Path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def crosscheck_cells(aggregate_dir: Path) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops?

    From ``crosscheck.parquet`` (per node and direction) and ``matrix_check.parquet`` (per node
    pair, from packet headers): the wire/framework ratio of the cell's tx bytes (headers
    included), the largest unexplained share on any node and direction, how many node pairs of
    the wire matrix agree with the framework matrix, and whether everything passed."""
    check = _read(Path(aggregate_dir) / "crosscheck.parquet")
    if check.empty:
        return pd.DataFrame()
    keys = ["cell", "strategy", "model", "nodes", "ranks_per_node", "bw"]
    tx = check[check["direction"] == "tx"]
    per_cell = tx.groupby(keys, as_index=False).agg(
        wire_bytes=("wire_bytes", "sum"), framework_bytes=("framework_bytes", "sum")
    )
    per_cell["wire/ops"] = per_cell["wire_bytes"] / per_cell["framework_bytes"]
    worst = check.groupby("cell", as_index=False).agg(
        unexplained_max_pct=("unexplained_fraction", lambda s: 100 * s.abs().max()),
        nodes_passed=("passed", "all"),
    )
    table = per_cell.merge(worst, on="cell")
    matrix = _read(Path(aggregate_dir) / "matrix_check.parquet")
    if not matrix.empty:
        pairs = matrix.groupby("cell", as_index=False).agg(
            pairs=("passed", "size"),
            pairs_passed=("passed", "sum"),
            matrix_ratio_min=("ratio", "min"),
            matrix_ratio_max=("ratio", "max"),
        )
        table = table.merge(pairs, on="cell", how="left")
        table["matrix_passed"] = table["pairs"].notna() & (table["pairs_passed"] == table["pairs"])
    else:
        table["matrix_passed"] = True  # no packet capture: nothing to compare
    table["agree"] = table["nodes_passed"] & table["matrix_passed"]
    table = table.drop(columns=["cell"]).sort_values(keys[1:]).reset_index(drop=True)
    return table


def crosscheck_strategies(aggregate_dir: Path) -> pd.DataFrame:
    """Per strategy: cells that passed the cross-validation and the spread of their ratios."""
    path = Path(aggregate_dir) / "crosscheck.parquet"
    return crosscheck_by_strategy(path) if path.exists() else pd.DataFrame()


def study_tables(
    aggregate_dir: Path,
    compare: list[Path],
    learning: tuple[Path, Path],
    imports: list[Path],
) -> list[dict]:
    """The report's table sections in order: title, intro (how to read it), frame."""
    from commscope.learning import learning_table
    from commscope.predict.pipeline import comparison_table

    return [
        {
            "title": "Wire vs recorded ops, per strategy",
            "intro": "Cross-validation of the two measurement levels (docs/crossvalidation.md). "
            "For every cell, the bytes each node's interface counted during the training window "
            "against the bytes its recorded ops imply under the algorithms the backend really "
            "runs (gloo: all-reduce rings, reduce-scatter as a full all-reduce, binomial "
            "broadcast, pairwise all-to-all), plus 66 B of headers per counted packet and gloo's "
            "48 B message preambles. A cell passes when the unexplained rest is at most 2 % of "
            "the ops' bytes (or 4 KB per step) on every node and direction. ratio = wire / ops, "
            "headers included.",
            "frame": crosscheck_strategies(aggregate_dir),
        },
        {
            "title": "Wire vs recorded ops, per cell",
            "intro": "wire/ops: the cell's transmitted bytes on the wire over the bytes its ops "
            "imply (headers included, so slightly above 1). unexplained_max_pct: the largest "
            "share left unexplained on any node and direction. pairs_passed: node pairs whose "
            "bytes in the packet-header capture (the wire node x node matrix) agree with the "
            "framework node x node matrix within the same tolerance. agree = both checks pass.",
            "frame": crosscheck_cells(aggregate_dir),
        },
        {
            "title": "Predicted vs measured traffic",
            "intro": "The analytical model (commscope predict) against the trace: bytes and "
            "messages of one steady step summed over ranks, per traffic type. exact = every "
            "rank and measured step matched in bytes and message count. MoE token all-to-alls "
            "depend on routing: the model predicts balanced experts.",
            "frame": comparison_table(list(compare)),
        },
        {
            "title": "Learning runs",
            "intro": "Training loss at the first and last step (mean over ranks) and, for MoE "
            "cells, the all-to-all non-uniform factor ((max - min) / mean tokens received per "
            "EP rank) at the first and last step.",
            "frame": learning_table(*learning),
        },
        {
            "title": "Imported traces",
            "intro": "Traces recorded by others on GPU clusters (config imports:), loaded into "
            "the same ops table: per-step volume and op mix. Their op tables, message sizes "
            "and communication matrices are under results/imports/.",
            "frame": pd.concat(map(pd.read_parquet, imports)) if imports else pd.DataFrame(),
        },
    ]
