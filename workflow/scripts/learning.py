"""Rule learning: loss over steps and MoE routing per iteration, with their figures."""

from pathlib import Path

from commscope.logs import log_to
from commscope.metrics.learning import aggregate_learning
from commscope.plots.learning import plot_learning

with log_to(snakemake.log[0]):
    loss, routing = Path(snakemake.output.loss), Path(snakemake.output.routing)
    aggregate_learning(
        list(map(Path, snakemake.input.train)), list(map(Path, snakemake.input.moe)), loss, routing
    )
    plot_learning(loss, routing, Path(snakemake.output.figures))
