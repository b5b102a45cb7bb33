"""Rule scenario_heatmap: one predicted scenario's node x node heatmap (GB per step)."""

from pathlib import Path

from commscope.logs import log_to
from commscope.plots.scenarios import plot_scenario_heatmap

with log_to(snakemake.log[0]):
    plot_scenario_heatmap(Path(snakemake.input[0]), Path(snakemake.output[0]))
