# The final self-contained HTML report.


rule report:
    input:
        aggregate=rules.aggregate.output,
        figures=rules.study_figures.output,
        learning=rules.learning.output.figures,
        learning_tables=[rules.learning.output.loss, rules.learning.output.routing],
        compare=expand(
            f"{RUNS}/{{cell}}/predict/compare.parquet",
            cell=cellspace.instance_patterns,
        ),
        cell_figures=expand(
            f"{RUNS}/{{cell}}/figures/throughput.png", cell=cellspace.instance_patterns
        ),
    output:
        "results/report/index.html",
    log:
        "results/logs/report.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        config=config,
        cells=list(cellspace.instance_patterns),
    script:
        "../scripts/report.py"
