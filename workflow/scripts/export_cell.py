"""Rule export_cell: one cell's traces for simulators and trace viewers."""

from pathlib import Path

from commscope.export.cell import export_cell
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    export_cell(Path(snakemake.input.cell).parent, Path(snakemake.output.perfetto).parent)
