# Predictions beyond the cluster: the named scenarios of `predictions:` (e.g. seed 002's GPT
# models on 16 and 32 GPUs), predicted analytically in seconds, nothing launched. Each rule
# takes only its own scenario through params:, so editing one scenario reruns only it (and
# the table and figure that gather them all). File names come from the data contract.
from commscope.contracts import SCENARIO_FILES

PREDICTIONS = "results/predictions"


rule predict_scenario:
    output:
        **{
            key: f"{PREDICTIONS}/{{name}}/{file}"
            for key, file in SCENARIO_FILES.items()
        },
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
            rules.predict_scenario.output.traffic, name=sorted(config["predictions"])
        ),
        meta=expand(
            rules.predict_scenario.output.meta, name=sorted(config["predictions"])
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
            rules.predict_scenario.output.node_matrix,
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
