"""Analytical prediction of per-rank communication and step time.

:mod:`.ops` lists the ops of one steady-state step (what commscope's trainer issues, or
Megatron/DeepSpeed PTD-P as in seed 002) from the parameter inventories of :mod:`.shapes`, the
framework bucketing of :mod:`.frameworks` and the pipeline schedules of :mod:`.schedule`;
:mod:`.compare` checks them against measured ops and sums them into volumes and messages,
:mod:`.matrix` into rank/node matrices; :mod:`.timing` turns them into step time, communication
and bubble ratios with an alpha-beta model; :mod:`.cell` does both for one measured cell of the
pipeline; :mod:`.scenarios` predicts named configurations far larger than the cluster (seed
002's GPT-1.5B/3B on 16/32 GPUs) into traffic tables and node x node matrices; :mod:`.cli` is
``commscope predict``.
"""

from commscope.predict.compare import compare_measured, summarize, traffic_of
from commscope.predict.matrix import node_matrix, rank_matrix
from commscope.predict.ops import TRAFFIC_TYPES, predict_ops
from commscope.predict.options import PredictOptions
from commscope.predict.scenarios import (
    PRESETS,
    ScenarioPrediction,
    predict_scenario,
    resolve_scenario,
    scenario_tables,
)
from commscope.predict.timing import predict_step_time

__all__ = [
    "PRESETS",
    "TRAFFIC_TYPES",
    "PredictOptions",
    "ScenarioPrediction",
    "compare_measured",
    "node_matrix",
    "predict_ops",
    "predict_scenario",
    "predict_step_time",
    "rank_matrix",
    "resolve_scenario",
    "scenario_tables",
    "summarize",
    "traffic_of",
]
