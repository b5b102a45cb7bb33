# Predictions beyond the cluster: the named scenarios of `predictions:` (e.g. seed 002's GPT
# models on 16 and 32 GPUs), predicted analytically in seconds, nothing launched. Each rule
# takes only its own scenario through params:, so editing one scenario reruns only it (and
# the table and figure that gather them all).

PREDICTIONS = "results/predictions"


rule predict_scenario:
    output:
        traffic=f"{PREDICTIONS}/{{name}}/traffic.parquet",
        node_matrix=f"{PREDICTIONS}/{{name}}/node_matrix.parquet",
        rank_matrix=f"{PREDICTIONS}/{{name}}/rank_matrix.parquet",
        meta=f"{PREDICTIONS}/{{name}}/scenario.json",
    log:
        "results/logs/predict_scenario/{name}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        # Only this scenario's definition: editing another scenario reruns nothing here.
        scenario=lookup(dpath="predictions/{name}", within=config),
    script:
        "../scripts/predict_scenario.py"


rule scenario_heatmap:
    input:
        rules.predict_scenario.output.node_matrix,
    output:
        f"{PREDICTIONS}/{{name}}/heatmap.png",
    log:
        "results/logs/scenario_heatmap/{name}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/predict_scenario_heatmap.py"


rule predictions_table:
    input:
        traffic=expand(
            f"{PREDICTIONS}/{{name}}/traffic.parquet",
            name=sorted(config["predictions"]),
        ),
        meta=expand(
            f"{PREDICTIONS}/{{name}}/scenario.json", name=sorted(config["predictions"])
        ),
    output:
        f"{PREDICTIONS}/table.parquet",
    log:
        "results/logs/predictions_table.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/predict_scenario_table.py"


rule predictions_heatmaps:
    input:
        expand(
            f"{PREDICTIONS}/{{name}}/node_matrix.parquet",
            name=sorted(config["predictions"]),
        ),
    output:
        f"{PREDICTIONS}/heatmaps.png",
    log:
        "results/logs/predictions_heatmaps.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/predict_scenario_heatmaps.py"
