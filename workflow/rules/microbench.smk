# Collective microbenchmarks per link setting (docs/microbench.md): run on the cluster, analyse
# per link, combine across links, figures. Their fits feed predict_cell's step-time prediction.
rule microbench_run:
    output:
        directory(f"{BENCH}/{LINK}/raw"),
    log:
        f"results/logs/microbench_run/{LINK}.log",
    benchmark:
        f"results/benchmarks/microbench_run/{LINK}.tsv"
    conda:
        "../../envs/commscope.yaml"
    # Every core Snakemake was given: no other job of the study (its analysis, figures,
    # predictions) runs beside a measurement, so the host's load is the measurement's own
    # (issue 25, isolation; docs/reliability.md). The fidelity monitor checks the rest.
    threads: workflow.cores
    resources:
        # Like run_cell: one job at a time owns the cluster.
        cluster_slot=1,
    params:
        link=link_of,
        microbench=BENCH_SETTINGS,
        run=RUN_SETTINGS,
        cluster=config["cluster"],
    script:
        "../scripts/microbench_run.py"


rule microbench_analyse:
    input:
        rules.microbench_run.output,
    output:
        **bench_outputs(f"{BENCH}/{LINK}"),
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
            table: expand(path, link=BENCH_LINKS["link"])
            for table, path in bench_outputs(f"{BENCH}/{{link}}").items()
        },
    output:
        **bench_outputs(BENCH),
    log:
        "results/logs/microbench_tables.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/microbench_tables.py"


# The figures' names come from the package that draws them.
from commscope.contracts import BENCH_FIGURES


rule microbench_figures:
    input:
        summary=rules.microbench_tables.output.summary,
        fit=rules.microbench_tables.output.fit,
    output:
        **{name: f"{BENCH}/figures/{name}.png" for name in BENCH_FIGURES},
    log:
        "results/logs/microbench_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/microbench_figures.py"
