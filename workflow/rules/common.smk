# Shared helpers: the sweep cells (Paramspace, one directory level per axis) and their settings.
import logging
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import Paramspace

from commscope.cluster.provision import load_inventory, teardown
from commscope.config import check_study, strategy_spec
from commscope.bench.analysis import BENCH_FILES, fit_links, link_settings
from commscope.spec.link import LINK_AXES, LinkSetting
from commscope.spec.settings import (
    MICROBENCH_SCOPE_KEYS,
    ClusterSettings,
    MicrobenchSettings,
)


def _engine_probe(requested):
    from commscope.experiment.readiness import local_engine_problem

    return local_engine_problem(requested)


# Impossible combinations stop the workflow here, before any node is touched.
if config["cluster"]["backend"] == "ssh":
    CELLS = check_study(
        config, max_nodes=len(load_inventory(config["cluster"]["inventory"]))
    )
else:
    CELLS = check_study(config, engine_problem=_engine_probe)
cellspace = Paramspace(CELLS)
CELL = cellspace.wildcard_pattern
RUNS = "results/runs"


# Wildcards never climb out of results/: a value is one path component that starts with a
# letter or digit ('..' and '.hidden' cannot match), as the schema asks of names and values.
SAFE_COMPONENT = "[A-Za-z0-9][A-Za-z0-9._-]*"


wildcard_constraints:
    **{axis: SAFE_COMPONENT for axis in CELLS.columns},
    name=SAFE_COMPONENT,


def cell_params(wildcards):
    """The cell's own sweep values (typed), and nothing else: reruns follow only them."""
    return cellspace.instance(wildcards)


def model_params(wildcards):
    return config["models"][wildcards.model]


def strategy_params(wildcards):
    """Only this cell's strategy definition: editing another strategy reruns nothing here."""
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
# Bad settings (sizes, unknown keys) stop the workflow at load time, naming the keys.
MicrobenchSettings.from_mapping(BENCH_SETTINGS)


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
