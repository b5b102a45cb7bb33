# commscope: what each parallelism strategy of distributed training does to the network.
# Orchestration only; every stage's logic lives in src/commscope/. Run: snakemake --cores 8 report

from pathlib import Path

from snakemake.utils import min_version

from commscope.config import path_escapes, read_yaml, validate_config

min_version("9.0")


configfile: "config/config.yaml"


# Snakemake's YAML loader keeps the last of two equal keys and expands aliases (a 5 kB alias
# bomb runs for minutes): read every config file again, strictly, so those are errors that name
# the file and line.
for _configfile in workflow.configfiles:
    read_yaml(_configfile)


# Snakemake's schema validation (defaults filled in), with errors that name the key and value.
# The schema is found next to this Snakefile, whatever the working directory.
validate_config(
    config, Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
)


include: "workflow/rules/common.smk"
include: "workflow/rules/replay.smk"
include: "workflow/rules/run.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/scenarios.smk"
include: "workflow/rules/imports.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        # Every cell's status: its exports too, when it ran.
        STATUSES,


onstart:
    preflight()


# The cluster lives only while the workflow runs: taken down on success and on failure alike.
# Every job ran; cells that failed after their attempts are in the report, and named here: the
# command exits non-zero once the report is written. Either way they run again next time.
onsuccess:
    teardown_cluster()
    fail_on_failed_cells(release_failed_cells())


onerror:
    teardown_cluster()
    release_failed_cells()


# Nothing is written outside results/: every rule's outputs, logs and benchmarks are checked
# here, before any job runs (names and wildcard values are single safe path components).
# Keep this last: it sees only the rules defined above it.
_escapes = [
    why
    for _rule in workflow.rules
    for _path in (
        *_rule.output,
        *_rule.log,
        *([_rule.benchmark] if _rule.benchmark else []),
    )
    if (why := path_escapes(str(_path), WILDCARD_NAMES))
]
if _escapes:
    raise WorkflowError("outputs outside results/:\n  " + "\n  ".join(_escapes))
