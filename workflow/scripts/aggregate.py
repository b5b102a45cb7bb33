"""Rule aggregate: concatenate every cell's metric tables."""

from pathlib import Path

from commscope.logs import log_to
from commscope.metrics import aggregate_cells

with log_to(snakemake.log[0]):
    aggregate_cells([Path(p).parent for p in snakemake.input], Path(snakemake.output[0]).parent)
