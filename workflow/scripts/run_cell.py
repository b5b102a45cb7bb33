"""Rule run_cell: bring the cluster up if needed and run one sweep cell on it."""

from pathlib import Path

from commscope.logs import log_to
from commscope.runner import provision_and_run

with log_to(snakemake.log[0]):
    provision_and_run(
        cluster_cfg=snakemake.params.cluster,
        cell=dict(snakemake.params.cell),
        model=dict(snakemake.params.model),
        strategy=dict(snakemake.params.strategy),
        run=dict(snakemake.params.run),
        out_dir=Path(snakemake.output[0]),
    )
