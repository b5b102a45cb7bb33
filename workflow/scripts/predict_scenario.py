"""Rule predict_scenario: one named scenario's traffic tables and matrices, analytically."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.scenarios import run_scenario

with log_to(snakemake.log[0]):
    run_scenario(
        snakemake.wildcards.name,
        dict(snakemake.params.scenario),
        Path(snakemake.output.traffic).parent,
    )
