"""Rule microbench_tables: every link setting's microbenchmark tables in one of each."""

from pathlib import Path

from commscope.bench.analysis import combine
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    combine(
        link_dirs=[Path(p).parent for p in snakemake.input],
        out_dir=Path(snakemake.output.fit).parent,
    )
