"""Rule parse_cell: raw per-node files -> tidy per-cell tables (the rule's declared outputs)."""

from pathlib import Path

from commscope.cell.parse import build_cell_tables
from commscope.contracts import CELL_TABLE_FILES
from commscope.logs import log_to
from commscope.spec.settings import CellSettings

with log_to(snakemake.log[0]):
    build_cell_tables(
        raw_dir=Path(snakemake.input[0]),
        cell=CellSettings.from_mapping(snakemake.params.cell),
        warmup_steps=snakemake.params.warmup_steps,
        paths={name: Path(snakemake.output[name]) for name in CELL_TABLE_FILES},
    )
