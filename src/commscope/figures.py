# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.plots.scenarios import plot_scenario_heatmap, plot_scenario_heatmaps  # noqa: F401
