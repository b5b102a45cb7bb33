"""Rule learning: loss over steps and MoE routing per iteration, with their figures."""

from pathlib import Path

from commscope.learning import aggregate_learning, plot_learning
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    out = Path(snakemake.output.loss).parent
    aggregate_learning(
        list(map(Path, snakemake.input.train)), list(map(Path, snakemake.input.moe)), out
    )
    plot_learning(out, Path(snakemake.output.figures))
