"""What a node lacks for a cell's probes, said before anything runs (``commscope check
--nodes``): the BPF wire accounting (attach it once on the experiment interface), and the
fallback's tools. The runner checks the same when it prepares a cell and falls back to the
/proc sampler with the reason; this tells the user first, node by node."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from commscope.cluster.hosts import Host, on_all
from commscope.experiment.probes import WIRE_MODULE, WIRE_OBJECT, sudo
from commscope.node.wire import WireError, build_object, ring_slots
from commscope.spec.settings import RunSettings


def node_problems(host: Host, obj: Path | None) -> list[str]:
    """What ``host`` lacks: the wire accounting (when ``obj`` was built), tcpdump and ethtool
    (the fallback's capture, the link facts). One line per problem, naming the fix."""
    spec = host.spec
    rdir = f"{spec.workdir}/readiness"
    problems = []
    host.run(f"mkdir -p {shlex.quote(rdir)}")
    try:
        if obj is not None:
            host.put(obj, f"{rdir}/{WIRE_OBJECT}")
            res = host.run(
                f"{sudo(spec)}{shlex.quote(spec.python)} -m {WIRE_MODULE} check "
                f"--iface {spec.exp_iface} --obj {rdir}/{WIRE_OBJECT}",
                warn=True,
            )
            if not res.ok:
                why = (res.stdout + res.stderr).strip()[-300:]
                problems.append(f"BPF wire accounting cannot attach ({why}); cells fall back")
        tools = {"tcpdump": "tcpdump", "ethtool": "ethtool"}
        for tool, package in tools.items():
            if not host.run(f"PATH=$PATH:/usr/sbin:/sbin command -v {tool}", warn=True).ok:
                problems.append(f"{tool} missing (Debian package {package})")
    finally:
        host.run(f"rm -rf {shlex.quote(rdir)}", warn=True)
    return problems


def check_nodes(hosts: list[Host], run: RunSettings) -> dict[str, list[str]]:
    """Per node, what it lacks for ``run``'s probes (empty lists: ready). The BPF object is
    built here as for a cell; when it cannot be, that is every node's first problem."""
    obj: Path | None = None
    built_problem: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if run.wire == "bpf":
            try:
                obj = build_object(run.wire_bin_ns, ring_slots(run.wire_bin_ns), 2, Path(tmp))
            except WireError as err:
                built_problem = [f"orchestrator: {err}"]
        found = on_all(hosts, lambda h: node_problems(h, obj))
    return {h.name: built_problem + p for h, p in zip(hosts, found, strict=True)}
