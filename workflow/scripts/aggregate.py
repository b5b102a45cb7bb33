"""Rule aggregate: concatenate every cell's metric tables, table by table, and derive the study
tables (means over repeats, message-size CDFs, bytes per step) the study figures draw."""

from pathlib import Path

from commscope.cell.status import ran_products, read_statuses
from commscope.contracts import METRIC_TABLES, STUDY_TABLES
from commscope.logs import log_to
from commscope.metrics.io import aggregate_tables
from commscope.spec.link import ReferenceLink

with log_to(snakemake.log[0]):
    # The cells that ran (their statuses name their tables); failed cells are left out.
    statuses = read_statuses(snakemake.input.status)
    aggregate_tables(
        {table: ran_products(statuses, f"metrics_{table}") for table in METRIC_TABLES},
        {table: Path(snakemake.output[table]) for table in (*METRIC_TABLES, *STUDY_TABLES)},
        ReferenceLink.from_config(snakemake.params.reference_link),
    )
