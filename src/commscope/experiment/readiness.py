"""What a node lacks for a cell's probes, said before anything runs (``commscope check
--nodes``): the BPF wire accounting (attach it once on the experiment interface), and the
fallback's tools. The runner checks the same when it prepares a cell and falls back to the
/proc sampler with the reason; this tells the user first, node by node."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from commscope.cluster.hosts import Host, on_all
from commscope.experiment.probes import build_wire_object, check_wire
from commscope.node.wire import WireError
from commscope.spec.settings import RunSettings


def node_problems(host: Host, obj: Path | None) -> list[str]:
    """What ``host`` lacks: the wire accounting (when ``obj`` was built), tcpdump and ethtool
    (the fallback's capture, the link facts). One line per problem, naming the fix."""
    rdir = f"{host.spec.workdir}/readiness"
    problems = []
    host.run(f"mkdir -p {shlex.quote(rdir)}")
    try:
        if obj is not None:
            why = check_wire(host, obj, rdir)
            if why:
                problems.append(f"BPF wire accounting cannot attach ({why}); cells fall back")
        tools = {"tcpdump": "tcpdump", "ethtool": "ethtool"}
        for tool, package in tools.items():
            if not host.run(f"PATH=$PATH:/usr/sbin:/sbin command -v {tool}", warn=True).ok:
                problems.append(f"{tool} missing (Debian package {package})")
    finally:
        host.run(f"rm -rf {shlex.quote(rdir)}", warn=True)
    return problems


def orchestrator_problem(run: RunSettings, cache_dir: Path) -> tuple[Path | None, str | None]:
    """The BPF object ``run`` needs, built in ``cache_dir``, or why it cannot be built here:
    (object, None), (None, why), or (None, None) when ``run`` does not use the BPF source."""
    if run.wire != "bpf":
        return None, None
    try:
        return build_wire_object(run, 2, cache_dir), None
    except WireError as err:
        return None, f"orchestrator: {err}"


def check_nodes(hosts: list[Host], run: RunSettings) -> dict[str, list[str]]:
    """Per node, what it lacks for ``run``'s probes (empty lists: ready). The BPF object is
    built here as for a cell; when it cannot be, that is every node's first problem."""
    with tempfile.TemporaryDirectory() as tmp:
        obj, why = orchestrator_problem(run, Path(tmp))
        found = on_all(hosts, lambda h: node_problems(h, obj))
    return {h.name: ([why] if why else []) + p for h, p in zip(hosts, found, strict=True)}
