"""Rule analyse_replay_cell: one replay cell's raw files to its trace tables, metric tables,
throughput figure and exports (commscope.analysis); compare_replay compares it with its program."""

from pathlib import Path

from commscope.analysis import analyse_cell
from commscope.logs import log_to
from commscope.spec.settings import CellSettings

with log_to(snakemake.log[0]):
    analyse_cell(
        raw=Path(snakemake.input.raw),
        cell=CellSettings.from_mapping(snakemake.params.cell),
        warmup_steps=snakemake.params.warmup_steps,
        outputs=dict(snakemake.output.items()),
    )
