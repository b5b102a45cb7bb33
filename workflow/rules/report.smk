# The final self-contained HTML report.


rule report:
    input:
        aggregate=rules.aggregate.output,
        figures=rules.study_figures.output,
        learning=rules.learning.output.figures,
        learning_tables=[rules.learning.output.loss, rules.learning.output.routing],
        imports=expand(
            "results/imports/{name}/summary.parquet", name=sorted(config["imports"])
        ),
        # Exports are part of a study's results: `report` makes them too.
        exports=expand(
            f"{RUNS}/{{cell}}/export/trace.json", cell=cellspace.instance_patterns
        ),
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
