"""The ``commscope`` command: housekeeping around the Snakemake pipeline.

commscope cleanup [--name N]  remove the namespaces, bridges, veths and processes a crashed run of
                  [--all]     cluster N left (not while a live run holds it); --all: every cluster
commscope cleanup --inventory FILE
                             on every host of an ssh inventory: unshape its experiment NIC and
                             kill every commscope process a crashed run left
commscope check [CONFIG]     validate a study config (the workflow's own checks) without running it
               [--nodes]     ... and say what each node of its cluster lacks
commscope replay (--trace F.. | --cell DIR | --scenario NAME) --nodes N --out DIR [...]
                             re-issue a trace's communication on the cluster and measure it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


# Each subcommand imports what it needs when it runs (all downward): `commscope cleanup` after a
# crash must not wait for pandas, matplotlib or torch to load.
def _cleanup(args: argparse.Namespace) -> int:
    """Remove what a crashed run left: 0 when done, 2 when a live run holds what was asked for
    (it is named; --force removes it anyway) or the input is bad, 1 when something is left."""
    if args.inventory is not None:
        return _cleanup_inventory(args.inventory, force=args.force)
    import os

    from commscope.cluster.claim import claim_or_holder
    from commscope.cluster.teardown import cleanup_all, teardown_netns

    if args.all:
        spared: dict[str, str] = {}
        removed = cleanup_all(spare_claimed=not args.force, spared=spared)
        print("removed: " + (", ".join(removed) if removed else "nothing (already clean)"))
        for name, holder in sorted(spared.items()):
            print(
                f"cluster {name!r} is in use by {holder}: it is not a leftover, left alone. "
                "Stop that run first, or pass --force to remove it anyway",
                file=sys.stderr,
            )
        return 2 if spared else 0
    name = args.name or _config_cluster_name(Path("config/config.yaml"))
    try:
        # Held while removing: no run claims the name between this check and the removal.
        claim, holder = claim_or_holder(name, f"pid {os.getpid()} (commscope cleanup)")
    except ValueError as err:
        print(f"commscope cleanup: {err}", file=sys.stderr)
        return 2
    if holder and not args.force:
        print(
            f"cluster {name!r} is in use by {holder}: it is not a leftover. Stop that run "
            "first, or pass --force to remove it anyway",
            file=sys.stderr,
        )
        return 2
    try:
        removed = teardown_netns(name)
    finally:
        if claim is not None:
            claim.close()
    print("removed: " + (", ".join(removed) if removed else "nothing (already clean)"))
    return 0


def _cleanup_inventory(path: Path, force: bool = False) -> int:
    """Clean every host of the ssh inventory at ``path``; print what was removed per host.
    2 for a bad inventory, or when a live run holds the study's cluster name or is running on
    a host (without ``force``: that host is left as it is); 1 when a host is unreachable or
    something could not be removed."""
    from commscope.cluster.claim import cluster_holder
    from commscope.config import ConfigError
    from commscope.experiment.cleanup import cleanup_inventory

    # A study on ssh hosts claims its cluster name on the machine it runs from, as a netns one
    # does: while the study of this directory's config holds it, its hosts are not leftovers.
    config = Path("config/config.yaml")
    name = _config_cluster_name(config)
    holder = None
    if _config_cluster_backend(config) == "ssh" and not force:
        try:
            holder = cluster_holder(name)
        except ValueError:  # a name no cluster can have: nobody holds it
            holder = None
    if holder:
        print(
            f"cluster {name!r} is in use by {holder}: its hosts hold no leftovers while it "
            "runs. Stop that run first, or pass --force to clean them anyway",
            file=sys.stderr,
        )
        return 2
    try:
        reports = cleanup_inventory(path, force=force)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.describe())
    if any(report.live for report in reports):
        print(
            "a live run was found on "
            + ", ".join(r.node for r in reports if r.live)
            + ": left as it is. Stop that run first, or pass --force to clean it anyway",
            file=sys.stderr,
        )
        return 2
    return 0 if all(report.clean for report in reports) else 1


def _config_cluster_backend(path: Path) -> str:
    """``cluster.backend`` of the study config at ``path`` (``netns`` without one)."""
    from commscope.config import ConfigError, read_yaml

    try:
        return str((read_yaml(path).get("cluster") or {}).get("backend", "netns"))
    except (ConfigError, FileNotFoundError):
        return "netns"


def _config_cluster_name(path: Path) -> str:
    """``cluster.name`` of the study config at ``path``, or the default ``cs`` without one."""
    from commscope.config import ConfigError, read_yaml

    try:
        return str((read_yaml(path).get("cluster") or {}).get("name", "cs"))
    except ConfigError:
        return "cs"


def _check(args: argparse.Namespace) -> int:
    from commscope.config import ConfigError, load_config
    from commscope.study import study_checks

    try:
        config = load_config(args.config, args.schema)
        # The workflow's own checks (the Snakefile calls the same function).
        cells = study_checks(config)
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


def _check_nodes(config: dict, nodes: int) -> int:
    """Connect to the cluster's nodes (provisioning a netns cluster if needed) and say, node by
    node, what the cells' probes would lack there; 1 when any node lacks something or the
    nodes cannot be checked (the cluster busy, a node unreachable: one line says why).

    Provisioning replaces a netns cluster's sshds and the check attaches on the experiment
    interfaces, so the cluster's name is claimed first, as a study's preflight claims it: while
    a live run holds it, nothing is touched."""
    import os

    from commscope.cluster.claim import ClusterBusy, claim_cluster
    from commscope.cluster.provision import provision
    from commscope.experiment.readiness import check_nodes
    from commscope.spec.settings import ClusterSettings, RunSettings

    cluster_cfg = ClusterSettings.from_mapping(config.get("cluster", {}))
    try:
        claim = claim_cluster(
            cluster_cfg.name, f"pid {os.getpid()} (commscope check --nodes in {Path.cwd()})"
        )
    except ClusterBusy as busy:
        print(f"cluster.name: {busy}. {_BUSY_FIX}", file=sys.stderr)
        return 1
    try:
        cluster = provision(cluster_cfg, nodes, Path.cwd())
        hosts = cluster.hosts()[:nodes]
        try:
            found = check_nodes(hosts, RunSettings.from_mapping(config.get("run", {})))
        finally:
            for host in hosts:
                host.close()
    except _node_errors() as err:
        print(f"cluster: {_node_error_line(err)}", file=sys.stderr)
        return 1
    finally:
        claim.close()
    for name, problems in found.items():
        print(f"{name}: " + ("; ".join(problems) if problems else "ready"))
    return 1 if any(found.values()) else 0


_BUSY_FIX = (
    "Wait for that run to end, or give this command its own cluster.name (and subnets) in "
    "the config"
)


def _node_errors() -> tuple[type[BaseException], ...]:
    """What stops a command at the cluster (provisioning it, or a node: a refused workdir, an
    SSH error, a node command that failed), said in one line by :func:`_node_error_line`."""
    from invoke.exceptions import Failure
    from paramiko import SSHException

    return (RuntimeError, OSError, EOFError, SSHException, Failure)


def _node_error_line(err: BaseException) -> str:
    """One line for an error met on the cluster: the node it came from (``on_all`` marks it)
    and the cause. A node command that failed (invoke's UnexpectedExit) is said by its
    stderr's first line (what failed) and last line (its reason: a tool's log ends with it)."""
    node = getattr(err, "node", None)
    result = getattr(err, "result", None)
    if result is not None and hasattr(result, "stderr"):
        lines = [ln.strip() for ln in (result.stderr or "").splitlines() if ln.strip()]
        text = f"exit {result.exited}"
        if lines:
            text = lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"
    elif node and node in str(err):
        text = str(err)  # it names its node itself (a refused workdir)
    else:
        text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    text = " ".join(text.split())
    return f"{node}: {text}" if node and node not in text else text


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


_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _replay(args: argparse.Namespace) -> int:
    """One replay cell outside a study (:func:`commscope.replay.run.replay_once`): 0 when it
    ran and matched its program, 1 when the cell failed or did not match, 2 for bad input."""
    import re

    from commscope.cluster.claim import ClusterBusy
    from commscope.config import ConfigError, load_config
    from commscope.experiment.cell import CellFailed
    from commscope.replay.run import replay_once
    from commscope.spec.link import LINK_AXES, LinkSetting
    from commscope.spec.settings import ClusterSettings, RunSettings

    try:
        if not re.match(_NAME, args.name):
            raise ValueError(f"--name {args.name!r}: use letters, digits, '.', '_' or '-'")
        config = load_config(args.config, args.schema)
        scenario = None
        if args.scenario is not None:
            scenario = (config.get("predictions") or {}).get(args.scenario)
            if scenario is None:
                raise ValueError(
                    f"--scenario {args.scenario!r} is not under predictions: in {args.config}"
                )
        link = {axis: getattr(args, axis) for axis in LINK_AXES}
        LinkSetting(**link).shape()  # a bad link value names itself before anything runs
        entry = {
            "scale": args.scale,
            "time_scale": args.time_scale,
            "compute": args.compute,
            "mirror": args.mirror,
            **({"ranks": args.ranks} if args.ranks else {}),
        }
        cell = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "steps": args.steps}
        result = replay_once(
            name=args.name,
            entry=entry,
            cell={**cell, **link},
            cluster=ClusterSettings.from_mapping(config["cluster"]),
            run=RunSettings.from_mapping(config["run"]),
            out_dir=args.out,
            trace_files=args.trace or (),
            cell_dir=args.cell,
            scenario=scenario,
        )
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"commscope replay: {err}", file=sys.stderr)
        return 2
    except CellFailed as err:
        print(f"commscope replay: the cell failed: {err}", file=sys.stderr)
        return 1
    except ClusterBusy as busy:
        print(f"commscope replay: cluster.name: {busy}. {_BUSY_FIX}", file=sys.stderr)
        return 1
    except _node_errors() as err:
        # A node tool that did not start, a node unreachable, the cluster not provisioned: the
        # cause in one line (the node's log keeps the rest), not a traceback.
        print(f"commscope replay: {_node_error_line(err)}", file=sys.stderr)
        return 1
    print(result.describe())
    return 0 if result.exact else 1


def _add_replay(sub: Any) -> None:
    from commscope.spec.link import UNSHAPED

    replay = sub.add_parser(
        "replay",
        help="re-issue a trace's communication on the cluster and measure it (docs/replay.md)",
    )
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, nargs="+", help="trace files (all ranks)")
    source.add_argument("--cell", type=Path, help="a measured cell's directory (results/runs/...)")
    source.add_argument("--scenario", help="a predictions: entry of --config")
    replay.add_argument("--name", default="replay", help="the replay's name in tables")
    replay.add_argument("--nodes", type=int, required=True)
    replay.add_argument("--ranks-per-node", type=int, default=1)
    replay.add_argument("--ranks", type=lambda t: [int(x) for x in t.split(",")],
                        help="node of each trace rank, e.g. 0,1,0,1 (default: blocks)")  # fmt: skip
    # One option per link axis, defaulting to the unshaped link (no cap, LINK_DEFAULTS).
    for axis, default in UNSHAPED.as_dict().items():
        replay.add_argument(f"--{axis}", default=default)
    replay.add_argument("--steps", type=int, default=4, help="replayed steps (warmup included)")
    replay.add_argument("--scale", type=float, default=1.0, help="message sizes x scale")
    replay.add_argument("--time-scale", type=float, default=1.0, help="compute gaps x this")
    replay.add_argument("--compute", choices=("auto", "busy", "sleep"), default="auto")
    replay.add_argument("--mirror", action="store_true", help="every rank replays rank 0's ops")
    replay.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                        help="the study config whose cluster: and run: blocks to use")  # fmt: skip
    replay.add_argument("--schema", type=Path,
                        default=Path("workflow/schemas/config.schema.yaml"))  # fmt: skip
    replay.add_argument("--out", type=Path, required=True, help="output directory")
    replay.set_defaults(func=_replay)


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
        help="every commscope cluster on this machine (namespaces named exactly cs-NAME-i), "
        "but those a live run holds (exit 2 naming them)",
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
    _add_replay(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
