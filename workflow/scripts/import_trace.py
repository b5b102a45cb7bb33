"""Rule import_trace: one external trace into the ops table, with op-level metrics."""

from pathlib import Path

from commscope.imported import analyze_import
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    analyze_import(
        list(map(Path, snakemake.input)),
        snakemake.wildcards.name,
        Path(snakemake.output.summary).parent,
    )
