"""Rule learning: loss over steps and MoE routing per iteration, with their figures."""

from pathlib import Path

from commscope.cell.status import ran_products, read_statuses
from commscope.logs import log_to
from commscope.metrics.learning import aggregate_learning
from commscope.plots.learning import plot_learning

with log_to(snakemake.log[0]):
    statuses = read_statuses(snakemake.input.status)
    loss, routing = Path(snakemake.output.loss), Path(snakemake.output.routing)
    aggregate_learning(
        ran_products(statuses, "trace_train"), ran_products(statuses, "trace_moe"), loss, routing
    )
    plot_learning(loss, routing, Path(snakemake.output.figures))
