"""Rule predictions_heatmaps: all predicted scenarios' node x node heatmaps, one colour scale."""

from pathlib import Path

from commscope.logs import log_to
from commscope.plots.scenarios import plot_scenario_heatmaps

with log_to(snakemake.log[0]):
    plot_scenario_heatmaps(list(map(Path, snakemake.input)), Path(snakemake.output[0]))
