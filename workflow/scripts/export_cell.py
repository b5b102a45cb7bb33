"""Rule export_cell: one cell's traces for simulators and trace viewers; ``chakra/`` is the
ASTRA-sim input set (``sh chakra/run_astra.sh`` with ``ASTRA_SIM`` naming the analytical
backend's binary simulates the cell; docs/export.md)."""

from pathlib import Path

from commscope.export.cell import export_cell_files
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    export_cell_files(
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        cell=Path(snakemake.input.cell),
        perfetto=Path(snakemake.output.perfetto),
        chakra=Path(snakemake.output.chakra),
        astra=Path(snakemake.output.astra),
        flows=Path(snakemake.output.flows),
    )
