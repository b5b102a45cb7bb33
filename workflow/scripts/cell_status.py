"""Rule cell_status: whether a cell ran and what it made, or its failure record (the
study-wide rules read these)."""

from pathlib import Path

from commscope.experiment.attempts import write_status
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    write_status(
        Path(snakemake.input.raw),
        snakemake.params.cell_id,
        Path(snakemake.output[0]),
        {name: str(path) for name, path in snakemake.input.items() if name != "raw"},
    )
