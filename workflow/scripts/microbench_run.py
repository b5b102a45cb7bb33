"""Rule microbench_run: bring the cluster up if needed and benchmark one link setting on it."""

from pathlib import Path

from commscope.bench.run import run_microbench
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    run_microbench(
        cluster_cfg=snakemake.params.cluster,
        link=dict(snakemake.params.link),
        microbench=dict(snakemake.params.microbench),
        run=dict(snakemake.params.run),
        out_dir=Path(snakemake.output[0]),
    )
