"""Rule import_trace: one external trace into the ops table, with op-level metrics."""

from pathlib import Path

from commscope.contracts import IMPORT_TABLES
from commscope.logs import log_to
from commscope.metrics.imported import analyze_import_files

with log_to(snakemake.log[0]):
    analyze_import_files(
        list(map(Path, snakemake.input)),
        snakemake.wildcards.name,
        {table: Path(snakemake.output[table]) for table in IMPORT_TABLES},
    )
