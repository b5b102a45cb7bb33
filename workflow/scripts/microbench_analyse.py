"""Rule microbench_analyse: tidy table, bandwidths and alpha-beta fits of one link setting."""

from pathlib import Path

from commscope.bench.analysis import analyse_link_files
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    analyse_link_files(
        raw_dir=Path(snakemake.input[0]),
        link=dict(snakemake.params.link),
        bench=Path(snakemake.output.bench),
        summary=Path(snakemake.output.summary),
        fit=Path(snakemake.output.fit),
    )
