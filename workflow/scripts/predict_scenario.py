"""Rule predict_scenario: one named scenario's traffic tables and matrices, analytically."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.scenarios import ScenarioFiles, run_scenario

with log_to(snakemake.log[0]):
    run_scenario(
        snakemake.wildcards.name,
        dict(snakemake.params.scenario),
        ScenarioFiles(
            traffic=Path(snakemake.output.traffic),
            node_matrix=Path(snakemake.output.node_matrix),
            rank_matrix=Path(snakemake.output.rank_matrix),
            meta=Path(snakemake.output.meta),
        ),
    )
