"""Rule cell_figure: throughput over time per node with step boundaries."""

from pathlib import Path

from commscope.figures import plot_cell_throughput
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    plot_cell_throughput(
        Path(snakemake.input.summary).parent, Path(snakemake.input.steps), Path(snakemake.output[0])
    )
