"""Analytical prediction of per-rank communication and step time.

:mod:`.model` lists the ops of one steady-state step (what commscope's trainer issues, or
Megatron/DeepSpeed PTD-P as in seed 002) and aggregates them into volumes, messages and
rank/node matrices; :mod:`.timing` turns them into step time, communication and bubble ratios
with an alpha-beta model; :mod:`.scenarios` predicts named configurations far larger than the
cluster (seed 002's GPT-1.5B/3B on 16/32 GPUs) into traffic tables and node x node matrices;
:mod:`.cli` is ``commscope predict``.
"""

from commscope.predict.model import (
    TRAFFIC_TYPES,
    PredictOptions,
    compare_measured,
    node_matrix,
    predict_ops,
    rank_matrix,
    summarize,
    traffic_of,
)
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
