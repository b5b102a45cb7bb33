"""Rule cell_metrics: one cell's metric tables."""

from pathlib import Path

from commscope.logs import log_to
from commscope.metrics import compute_cell_metrics

with log_to(snakemake.log[0]):
    compute_cell_metrics(Path(snakemake.input[0]).parent, Path(snakemake.output[0]).parent)
