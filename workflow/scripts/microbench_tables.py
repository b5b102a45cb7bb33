"""Rule microbench_tables: every link setting's microbenchmark tables in one of each."""

from pathlib import Path

from commscope.bench.analysis import BENCH_TABLES, combine_tables
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    combine_tables(
        {table: [Path(p) for p in snakemake.input[table]] for table in BENCH_TABLES},
        {table: Path(snakemake.output[table]) for table in BENCH_TABLES},
    )
