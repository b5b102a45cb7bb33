# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.predict.cell import comparison_table, rank_step_split, timing_table  # noqa: F401
