"""Rule microbench_analyse: tidy table, bandwidths and alpha-beta fits of one link setting."""

from pathlib import Path

from commscope.bench.analysis import BENCH_TABLES, analyse_link_files
from commscope.logs import log_to
from commscope.spec.link import LinkSetting

with log_to(snakemake.log[0]):
    analyse_link_files(
        raw_dir=Path(snakemake.input[0]),
        link=LinkSetting.from_mapping(snakemake.params.link),
        outputs={table: Path(snakemake.output[table]) for table in BENCH_TABLES},
    )
