# Figures per cell and across cells, and the learning-run tables and figures.


rule cell_figure:
    input:
        summary=f"{RUNS}/{CELL}/metrics/summary.parquet",
        steps=rules.parse_cell.output.steps,
    output:
        f"{RUNS}/{CELL}/figures/throughput.png",
    log:
        f"results/logs/cell_figure/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/cell_figure.py"


rule study_figures:
    input:
        rules.aggregate.output,
    output:
        directory("results/figures"),
    log:
        "results/logs/study_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/study_figures.py"


rule learning:
    input:
        train=expand(
            f"{RUNS}/{{cell}}/trace/train.parquet", cell=cellspace.instance_patterns
        ),
        moe=expand(
            f"{RUNS}/{{cell}}/trace/moe.parquet", cell=cellspace.instance_patterns
        ),
    output:
        loss="results/learning/loss.parquet",
        routing="results/learning/routing.parquet",
        figures=directory("results/learning/figures"),
    log:
        "results/logs/learning.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/learning.py"
