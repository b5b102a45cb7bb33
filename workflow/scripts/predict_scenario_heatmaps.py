"""Rule predictions_heatmaps: all predicted scenarios' node x node heatmaps, one colour scale."""

from pathlib import Path

from commscope.figures import plot_scenario_heatmaps
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    plot_scenario_heatmaps(list(map(Path, snakemake.input)), Path(snakemake.output[0]))
