"""Analytical prediction of per-rank communication and step time.

:mod:`.model` lists the ops of one steady-state step (what commscope's trainer issues, or
Megatron/DeepSpeed PTD-P as in seed 002) and aggregates them into volumes, messages and
rank/node matrices; :mod:`.timing` turns them into step time, communication and bubble ratios
with an alpha-beta model; :mod:`.cli` is ``commscope predict``.
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
from commscope.predict.timing import predict_step_time

__all__ = [
    "TRAFFIC_TYPES",
    "PredictOptions",
    "compare_measured",
    "node_matrix",
    "predict_ops",
    "predict_step_time",
    "rank_matrix",
    "summarize",
    "traffic_of",
]
