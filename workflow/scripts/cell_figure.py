"""Rule cell_figure: throughput over time per node with step boundaries."""

from pathlib import Path

from commscope.logs import log_to
from commscope.plots.cell import plot_cell_throughput

with log_to(snakemake.log[0]):
    plot_cell_throughput(
        throughput=Path(snakemake.input.throughput),
        step_times=Path(snakemake.input.step_times),
        summary=Path(snakemake.input.summary),
        out_png=Path(snakemake.output[0]),
    )
