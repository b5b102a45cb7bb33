"""Rule study_figures: comparisons across cells and strategies."""

from pathlib import Path

from commscope.figures import plot_study
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    plot_study(Path(snakemake.input[0]).parent, Path(snakemake.output[0]))
