# Collective microbenchmarks per link setting (docs/microbench.md): run on the cluster, analyse
# per link, combine across links, figures. Their fits feed predict_cell's step-time prediction.
from commscope.bench.analysis import LINK_AXES, fit_links
from commscope.bench.analysis import link_id, link_settings, message_sizes

MICROBENCH = config["microbench"]
BENCH = "results/microbench"
LINK = link_id({axis: f"{{{axis}}}" for axis in LINK_AXES})
BENCH_TABLES = ("bench", "summary", "fit")
# Bad size settings stop the workflow at load time, naming the keys.
message_sizes(MICROBENCH["min_bytes"], MICROBENCH["max_bytes"], MICROBENCH["factor"])
BENCH_LINKS = link_settings(MICROBENCH["links"], CELLS)
# The benchmark's own settings: editing which links to run reruns no benchmark.
BENCH_SETTINGS = {k: v for k, v in MICROBENCH.items() if k not in ("links", "enabled")}


# The link setting named by a job's bw/delay/jitter/loss wildcards.
link_of = lambda wildcards: {axis: str(wildcards[axis]) for axis in LINK_AXES}
# Fits predict_cell reads (its link's, and the unshaped one's for intra-node ops).
microbench_fits = lambda wildcards: expand(
    f"{BENCH}/{{link}}/fit.parquet",
    link=fit_links(link_of(wildcards), BENCH_LINKS["link"], MICROBENCH["enabled"]),
)


rule microbench_run:
    output:
        directory(f"{BENCH}/{LINK}/raw"),
    log:
        f"results/logs/microbench_run/{LINK}.log",
    benchmark:
        f"results/benchmarks/microbench_run/{LINK}.tsv"
    conda:
        "../../envs/commscope.yaml"
    resources:
        # Like run_cell: one job at a time owns the cluster.
        cluster_slot=1,
    params:
        link=link_of,
        microbench=BENCH_SETTINGS,
        run=config["run"],
        cluster=config["cluster"],
    script:
        "../scripts/microbench_run.py"


rule microbench_analyse:
    input:
        rules.microbench_run.output,
    output:
        bench=f"{BENCH}/{LINK}/bench.parquet",
        summary=f"{BENCH}/{LINK}/summary.parquet",
        fit=f"{BENCH}/{LINK}/fit.parquet",
    log:
        f"results/logs/microbench_analyse/{LINK}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        link=link_of,
    script:
        "../scripts/microbench_analyse.py"


rule microbench_tables:
    input:
        **{
            table: expand(
                f"{BENCH}/{{link}}/{table}.parquet", link=BENCH_LINKS["link"]
            )
            for table in BENCH_TABLES
        },
    output:
        bench=f"{BENCH}/bench.parquet",
        summary=f"{BENCH}/summary.parquet",
        fit=f"{BENCH}/fit.parquet",
    log:
        "results/logs/microbench_tables.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/microbench_tables.py"


rule microbench_figures:
    input:
        summary=rules.microbench_tables.output.summary,
        fit=rules.microbench_tables.output.fit,
    output:
        directory(f"{BENCH}/figures"),
    log:
        "results/logs/microbench_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/microbench_figures.py"
