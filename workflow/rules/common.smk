# Shared helpers: the sweep cells (Paramspace, one directory level per axis) and their settings.
import logging
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import Paramspace

from commscope.cluster.provision import teardown
from commscope.config import (
    REPLAY_STRATEGY,
    cell_id,
    replay_source_cell,
    strategy_spec,
)
from commscope.contracts import CELL_TABLE_FILES
from commscope.bench.analysis import BENCH_FILES, fit_links, link_settings
from commscope.spec.link import LINK_AXES, LinkSetting
from commscope.spec.settings import MICROBENCH_SCOPE_KEYS, ClusterSettings
from commscope.study import study_checks

# Impossible combinations stop the workflow here, before any node is touched: the same
# checks as `commscope check` (commscope.study.study_checks).
CELLS = study_checks(config)
cellspace = Paramspace(CELLS)
CELL = cellspace.wildcard_pattern
RUNS = "results/runs"


# Wildcards never climb out of results/: a value is one path component that starts with a
# letter or digit ('..' and '.hidden' cannot match), as the schema asks of names and values.
SAFE_COMPONENT = "[A-Za-z0-9][A-Za-z0-9._-]*"


# Every wildcard a rule's output may use, each limited to one safe component (the Snakefile
# checks that no output uses another).
WILDCARD_NAMES = {*CELLS.columns, "name"}


wildcard_constraints:
    **{axis: SAFE_COMPONENT for axis in CELLS.columns},
    name=SAFE_COMPONENT,


def cell_params(wildcards):
    """The cell's own sweep values (typed), and nothing else: reruns follow only them."""
    return cellspace.instance(wildcards)


def model_params(wildcards):
    """The cell's model, or for a replay cell its entry under replays: (source, scale, ...)."""
    if wildcards.strategy == REPLAY_STRATEGY:
        return config["replays"][wildcards.model]
    return config["models"][wildcards.model]


def strategy_params(wildcards):
    """Only this cell's strategy definition: editing another strategy reruns nothing here."""
    if wildcards.strategy == REPLAY_STRATEGY:
        return {}
    return strategy_spec(config, wildcards.strategy)


def all_cells(pattern):
    return expand(pattern, cell=cellspace.instance_patterns)


# The claim on the cluster's name while this run lives (see preflight).
CLUSTER_CLAIM = []


def preflight():
    """Before any job runs (not on dry runs): can this machine host the configured cluster,
    and is its name free? The run then holds the name until it ends, so another checkout's run
    or `commscope cleanup` cannot tear its namespaces down mid-cell."""
    if config["cluster"]["backend"] == "netns":
        from commscope.cluster.netns import (
            ClusterBusy,
            claim_cluster,
            preflight_problems,
        )

        problems = preflight_problems()
        if problems:
            raise WorkflowError(
                "the netns cluster cannot run here:\n  - "
                + "\n  - ".join(problems)
                + "\nUse cluster.backend: ssh with real hosts (config/cluster.example.yaml)."
            )
        name = config["cluster"]["name"]
        try:
            CLUSTER_CLAIM.append(
                claim_cluster(name, f"pid {os.getpid()} (snakemake in {Path.cwd()})")
            )
        except ClusterBusy as busy:
            raise WorkflowError(
                f"cluster.name: {busy}. Wait for that run to end, or give this study its "
                "own cluster.name (and subnets)."
            ) from None


def teardown_cluster():
    try:
        teardown(ClusterSettings.from_mapping(config["cluster"]), Path.cwd())
    except Exception as err:  # never mask the workflow's own result
        logging.getLogger("commscope").warning("cluster teardown failed: %s", err)


# Collective microbenchmarks: the link settings they run on (docs/microbench.md).
MICROBENCH = config["microbench"]
BENCH = "results/microbench"
# One link setting's directory, with a wildcard per axis.
LINK = LinkSetting(*(f"{{{axis}}}" for axis in LINK_AXES)).id
BENCH_LINKS = link_settings(MICROBENCH["links"], CELLS)
# The benchmark's own settings (plain config values: params compare as written): editing
# which links to run reruns no benchmark.
BENCH_SETTINGS = {k: v for k, v in MICROBENCH.items() if k not in MICROBENCH_SCOPE_KEYS}


def bench_outputs(directory):
    """The analysis tables under ``directory``, by name (one link's or all links')."""
    return {table: f"{directory}/{file}" for table, file in BENCH_FILES.items()}


def link_of(wildcards):
    """The link setting named by a job's bw/delay/jitter/loss wildcards (a plain dict)."""
    return LinkSetting.from_wildcards(wildcards).as_dict()


def microbench_fits(wildcards):
    """Fits predict_cell reads (its link's, and the unshaped one's for intra-node ops)."""
    return expand(
        f"{BENCH}/{{link}}/{BENCH_FILES['fit']}",
        link=fit_links(
            LinkSetting.from_wildcards(wildcards),
            BENCH_LINKS["link"],
            MICROBENCH["enabled"],
        ),
    )


# Replays (replay.smk): the files a replay cell's program is built from, and the program.
def replay_source(wildcards):
    """The source trace's files: a measured cell's parsed tables, or an import's ops table;
    a predicted scenario needs none (it is predicted from its config entry)."""
    kind, ref = next(iter(config["replays"][wildcards.model]["source"].items()))
    if kind == "cell":
        trace = f"{RUNS}/{cell_id(replay_source_cell(config, wildcards.model))}/trace"
        return {
            table: f"{trace}/{CELL_TABLE_FILES[table]}"
            for table in ("ops", "steps", "cell")
        }
    if kind == "import":
        return {"ops": f"results/imports/{ref}/ops.parquet"}
    return {}


def replay_scenario(wildcards):
    """A prediction source's scenario entry ({} for other sources)."""
    kind, ref = next(iter(config["replays"][wildcards.model]["source"].items()))
    return config["predictions"][ref] if kind == "prediction" else {}


def replay_program(wildcards):
    """A replay cell's program and its description (run_cell's and predict_cell's input);
    nothing for a training cell."""
    if wildcards.strategy != REPLAY_STRATEGY:
        return {}
    out = rules.build_replay.output
    return {
        "program": out.program.format(**wildcards),
        "replay_meta": out.meta.format(**wildcards),
    }
