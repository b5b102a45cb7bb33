"""The ``commscope`` command: housekeeping around the Snakemake pipeline.

commscope cleanup [--name N]  remove the namespaces, bridges, veths and processes a crashed run of
                  [--all]     cluster N left (not while a live run holds it); --all: every cluster
commscope cleanup --inventory FILE
                             on every host of an ssh inventory: unshape its experiment NIC and
                             kill every commscope process a crashed run left
commscope check [CONFIG]     validate a study config (schema + combinations) without running it
               [--nodes]     ... and say what each node of its cluster lacks
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


# Each subcommand imports what it needs when it runs (all downward): `commscope cleanup` after a
# crash must not wait for pandas, matplotlib or torch to load.
def _cleanup(args: argparse.Namespace) -> int:
    if args.inventory is not None:
        return _cleanup_inventory(args.inventory)
    from commscope.cluster.netns import cleanup_all, cluster_holder, teardown_netns

    if args.all:
        removed = cleanup_all(spare_claimed=not args.force)
    else:
        name = args.name or _config_cluster_name(Path("config/config.yaml"))
        holder = cluster_holder(name)
        if holder and not args.force:
            print(
                f"cluster {name!r} is in use by {holder}: it is not a leftover. Stop that run "
                "first, or pass --force to remove it anyway",
                file=sys.stderr,
            )
            return 2
        removed = teardown_netns(name)
    print("removed: " + (", ".join(removed) if removed else "nothing (already clean)"))
    return 0


def _cleanup_inventory(path: Path) -> int:
    """Clean every host of the ssh inventory at ``path``; print what was removed per host.
    1 when a host is unreachable or something could not be removed, 2 for a bad inventory."""
    from commscope.config import ConfigError
    from commscope.experiment.cleanup import cleanup_inventory

    try:
        reports = cleanup_inventory(path)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.describe())
    return 0 if all(report.clean for report in reports) else 1


def _config_cluster_name(path: Path) -> str:
    """``cluster.name`` of the study config at ``path``, or the default ``cs`` without one."""
    from commscope.config import ConfigError, read_yaml

    try:
        return str((read_yaml(path).get("cluster") or {}).get("name", "cs"))
    except ConfigError:
        return "cs"


def _check(args: argparse.Namespace) -> int:
    from commscope.config import ConfigError, check_study, load_config

    try:
        config = load_config(args.config, args.schema)
        cells = check_study(config, engine_problem=_engine_probe(config))
    except (ConfigError, FileNotFoundError) as err:
        print(f"{args.config}: {err}", file=sys.stderr)
        return 2
    print(f"{args.config}: ok, {len(cells)} cells")
    print(_estimate_line(config, cells))
    note = _wire_note(config)
    if note:
        print(note, file=sys.stderr)
    if args.nodes:
        return _check_nodes(config, int(cells["nodes"].max()))
    return 0


def _engine_probe(config: dict) -> Callable[[str], str] | None:
    """The workflow's own link engine check for the netns backend (its nodes run here); real
    hosts are checked node by node with --nodes, and when a cell shapes them."""
    if (config.get("cluster") or {}).get("backend", "netns") != "netns":
        return None
    from commscope.experiment.readiness import local_engine_problem

    return local_engine_problem


def _check_nodes(config: dict, nodes: int) -> int:
    """Connect to the cluster's nodes (provisioning a netns cluster if needed) and say, node by
    node, what the cells' probes would lack there; 1 when any node lacks something."""
    from commscope.cluster.provision import provision
    from commscope.experiment.readiness import check_nodes
    from commscope.spec.settings import ClusterSettings, RunSettings

    cluster_cfg = ClusterSettings.from_mapping(config.get("cluster", {}))
    cluster = provision(cluster_cfg, nodes, Path.cwd())
    hosts = cluster.hosts()[:nodes]
    try:
        found = check_nodes(hosts, RunSettings.from_mapping(config.get("run", {})))
    finally:
        for host in hosts:
            host.close()
    for name, problems in found.items():
        print(f"{name}: " + ("; ".join(problems) if problems else "ready"))
    return 1 if any(found.values()) else 0


def _estimate_line(config: dict, cells: Any) -> str:
    """The study's size and cluster time left (:func:`commscope.config.estimate_study`), as seen
    from the working directory's ``results/``."""
    from commscope.bench.analysis import link_settings
    from commscope.config import estimate_study

    bench = config.get("microbench") or {}
    links = (
        list(link_settings(bench.get("links", "sweep"), cells)["link"])
        if bench.get("enabled", True)
        else []
    )
    return estimate_study(cells, links, Path("results")).describe()


def _wire_note(config: dict) -> str | None:
    """Why the BPF wire source will fall back to the /proc sampler, where this machine (the
    orchestrator, which builds the program) can tell before anything runs; None when it can
    build it or the config does not ask for it. What a node lacks shows when it is prepared
    (`python -m commscope.node.wire check` on the node names it)."""
    import tempfile

    from commscope.experiment.readiness import orchestrator_problem
    from commscope.spec.settings import RunSettings

    with tempfile.TemporaryDirectory() as tmp:
        _, why = orchestrator_problem(RunSettings.from_mapping(config.get("run", {})), Path(tmp))
    if why is None:
        return None
    return (
        f"warning: run.wire is bpf but the program cannot be built here ({why}); "
        "cells will use the /proc sampler and tcpdump"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["predict"]:
        # The predictor owns its (many) flags: hand it the rest of the command line, and the
        # heatmap writer (plots sit above predict). Imported here, not at the top: the other
        # subcommands must not pay for pandas and matplotlib.
        from commscope.plots.scenarios import plot_scenario_heatmap
        from commscope.predict.cli import main as predict_main

        return predict_main(argv[1:], draw_heatmap=plot_scenario_heatmap)
    parser = argparse.ArgumentParser(prog="commscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cleanup = sub.add_parser(
        "cleanup", help="remove leftovers of the netns cluster, or of an ssh inventory's hosts"
    )
    scope = cleanup.add_mutually_exclusive_group()
    scope.add_argument(
        "--name",
        help="the cluster to remove (default: cluster.name of config/config.yaml, else cs)",
    )
    scope.add_argument(
        "--all",
        action="store_true",
        help="every commscope cluster on this machine (cs-* namespaces), but those a live run "
        "holds",
    )
    scope.add_argument(
        "--inventory",
        type=Path,
        help="ssh backend: on every host of this inventory, remove the shaping and kill every "
        "commscope process a crashed run left (run directories are kept)",
    )
    cleanup.add_argument(
        "--force", action="store_true", help="remove a cluster even while a live run holds it"
    )
    cleanup.set_defaults(func=_cleanup)
    sub.add_parser(
        "predict", help="predict traffic and step time analytically (see predict --help)"
    )
    check = sub.add_parser("check", help="validate a study config without running it")
    check.add_argument("config", nargs="?", type=Path, default=Path("config/config.yaml"))
    check.add_argument(
        "--schema",
        type=Path,
        default=Path("workflow/schemas/config.schema.yaml"),
        help="the workflow's config schema (default: as seen from the repository root)",
    )
    check.add_argument(
        "--nodes",
        action="store_true",
        help="also connect to the cluster's nodes and say what each lacks (BPF, tcpdump, ...)",
    )
    check.set_defaults(func=_check)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
