"""Rule aggregate: concatenate every cell's metric tables, table by table."""

from pathlib import Path

from commscope.contracts import METRIC_TABLES
from commscope.logs import log_to
from commscope.metrics.io import aggregate_tables

with log_to(snakemake.log[0]):
    aggregate_tables(
        {table: [Path(p) for p in snakemake.input[table]] for table in METRIC_TABLES},
        {table: Path(snakemake.output[table]) for table in METRIC_TABLES},
    )
