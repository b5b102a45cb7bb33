# commscope: what each parallelism strategy of distributed training does to the network.
# Orchestration only; every stage's logic lives in src/commscope/. Run: snakemake --cores 8 report


from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,


onstart:
    preflight()


# The cluster lives only while the workflow runs: taken down on success and on failure alike.
onsuccess:
    teardown_cluster()


onerror:
    teardown_cluster()
