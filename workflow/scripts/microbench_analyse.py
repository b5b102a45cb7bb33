"""Rule microbench_analyse: tidy table, bandwidths and alpha-beta fits of one link setting."""

from pathlib import Path

from commscope.bench.analysis import analyse_link
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    analyse_link(
        raw_dir=Path(snakemake.input[0]),
        link=dict(snakemake.params.link),
        out_dir=Path(snakemake.output.fit).parent,
    )
