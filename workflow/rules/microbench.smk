# Collective microbenchmarks per link setting (docs/microbench.md): run on the cluster, analyse
# per link, combine across links, figures. Their fits feed predict_cell's step-time prediction.
from commscope.bench.analysis import fit_inputs, link_id, link_of, link_settings
from commscope.bench.analysis import LINK_AXES, message_sizes

MICROBENCH = config["microbench"]
BENCH = "results/microbench"
LINK = link_id({axis: f"{{{axis}}}" for axis in LINK_AXES})
# Bad size settings stop the workflow at load time, naming the keys.
message_sizes(MICROBENCH["min_bytes"], MICROBENCH["max_bytes"], MICROBENCH["factor"])
BENCH_LINKS = link_settings(MICROBENCH["links"], CELLS)
# The benchmark's own settings: editing which links to run reruns no benchmark.
BENCH_SETTINGS = {k: v for k, v in MICROBENCH.items() if k not in ("links", "enabled")}
# Fits predict_cell reads (its link's, and the unshaped one's for intra-node ops).
microbench_fits = lambda wildcards: fit_inputs(
    wildcards, MICROBENCH["enabled"], BENCH_LINKS["link"], BENCH
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
        expand(f"{BENCH}/{{link}}/fit.parquet", link=BENCH_LINKS["link"]),
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
