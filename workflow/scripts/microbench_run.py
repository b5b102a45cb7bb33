"""Rule microbench_run: bring the cluster up if needed and benchmark one link setting on it."""

from pathlib import Path

from commscope.bench.run import run_microbench
from commscope.logs import log_to
from commscope.spec.link import LinkSetting
from commscope.spec.settings import ClusterSettings, MicrobenchSettings, RunSettings

with log_to(snakemake.log[0]):
    run_microbench(
        cluster_cfg=ClusterSettings.from_mapping(snakemake.params.cluster),
        link=LinkSetting.from_mapping(snakemake.params.link),
        microbench=MicrobenchSettings.from_mapping(snakemake.params.microbench),
        run=RunSettings.from_mapping(snakemake.params.run),
        out_dir=Path(snakemake.output[0]),
    )
