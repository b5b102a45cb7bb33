"""The predictor against the trace (predicted vs measured traffic and step time per training
cell) and beyond the cluster (the predicted traffic of large GPT jobs, config ``predictions:``)."""

from __future__ import annotations

import pandas as pd

from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, training

_COMPARE_INTRO = (
    "The analytical model (commscope predict) against the trace: bytes and "
    "messages of one steady step summed over ranks, per traffic type. exact = every "
    "rank and measured step matched in bytes and message count. MoE token all-to-alls "
    "depend on routing: the model predicts balanced experts."
)
_TIMING_INTRO = (
    "The alpha-beta model per op (bandwidth_source: the microbenchmark fit of "
    "the cell's link, or the trace's own rate) on the predicted ops, compute time from "
    "the cell's trace (time outside communication), the pipeline bubble from the "
    "schedule; time_error = predicted / measured - 1 on the median steady step. DDP "
    "overlaps its all-reduce with backward, which the model does not, so it predicts "
    "an upper bound there."
)
_PREDICTIONS_INTRO = (
    "Seed 002's settings (config predictions:), predicted analytically in "
    "seconds: per scenario and traffic type, rank 0's messages and volume per step, the "
    "whole job's volume, and the share of it that crosses nodes. Default mapping "
    "pp-dp-tp (stages across nodes) vs customized dp-pp-tp (DP across nodes): the same "
    "bytes on other links. Node x node heatmaps are among the figures."
)


def timing_section(results: StudyResults) -> pd.DataFrame:
    """Predicted vs measured step time per training cell (``predict/timing.parquet``)."""
    table = training(results.timing)
    if table.empty:
        return table
    cols = ["strategy", "model", "nodes", "ranks_per_node", "bw", "bandwidth_source"]
    cols += ["predicted_step_s", "measured_step_s", "time_error", "predicted_comm_ratio"]
    cols += ["measured_comm_ratio", "predicted_bubble_ratio"]
    return table[cols].sort_values(cols[:5]).reset_index(drop=True)


def predictions_section(results: StudyResults) -> pd.DataFrame:
    """Beyond the cluster: per scenario and traffic type, rank 0's messages and bytes and the
    whole job's bytes with the share that crosses nodes (``results/predictions/table.parquet``
    of :func:`commscope.predict.scenarios.scenario_tables`)."""
    table = results.table("predictions")
    if table.empty:
        return table
    table = table.assign(
        ptd=lambda t: (
            "(" + t.pp.astype(str) + "," + t.tp.astype(str) + "," + t.dp.astype(str) + ")"
        ),
        gpus=lambda t: t.world_size.astype(str) + " (" + t.gpus_per_node.astype(str) + "/node)",
        rank0_GB=lambda t: t.rank0_bytes / 1e9,
        job_GB=lambda t: t.bytes / 1e9,
        inter_node_pct=lambda t: 100 * t.inter_node_share,
    )
    cols = ["scenario", "model", "gpus", "ptd", "mapping", "traffic", "rank0_messages"]
    return table[[*cols, "rank0_GB", "job_GB", "inter_node_pct", "predict_seconds"]]


TRAFFIC = Section(
    "Predicted vs measured traffic",
    _COMPARE_INTRO,
    lambda results: training(results.comparison),
    place="detail",
)
STEP_TIME = Section(
    "Predicted vs measured step time", _TIMING_INTRO, timing_section, place="detail"
)
SCENARIOS = Section(
    "Beyond the cluster: predicted traffic of large GPT jobs",
    _PREDICTIONS_INTRO,
    predictions_section,
)
