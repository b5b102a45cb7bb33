"""Rule predictions_table: every predicted scenario in one compact report table."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.scenarios import write_scenario_table

with log_to(snakemake.log[0]):
    write_scenario_table(
        [Path(p) for p in snakemake.input.traffic],
        [Path(p) for p in snakemake.input.meta],
        Path(snakemake.output[0]),
    )
