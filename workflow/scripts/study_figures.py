"""Rule study_figures: comparisons across cells and strategies."""

from pathlib import Path

from commscope.logs import log_to
from commscope.plots.study import plot_study

with log_to(snakemake.log[0]):
    plot_study(
        tables={name: Path(path) for name, path in snakemake.input.items()},
        figures={name: Path(path) for name, path in snakemake.output.items()},
    )
