"""Rule scenario_heatmap: one predicted scenario's node x node heatmap (GB per step)."""

from pathlib import Path

from commscope.figures import plot_scenario_heatmap
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    plot_scenario_heatmap(Path(snakemake.input[0]), Path(snakemake.output[0]))
