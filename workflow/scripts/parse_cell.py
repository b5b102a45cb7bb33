"""Rule parse_cell: raw per-node files -> tidy per-cell tables."""

from pathlib import Path

from commscope.logs import log_to
from commscope.traces import build_cell_tables

with log_to(snakemake.log[0]):
    build_cell_tables(
        raw_dir=Path(snakemake.input[0]),
        cell=dict(snakemake.params.cell),
        warmup_steps=snakemake.params.warmup_steps,
        out_dir=Path(snakemake.output.ops).parent,
    )
