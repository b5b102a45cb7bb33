"""What a node lacks for a cell, said before anything runs (``commscope check --nodes`` and the
workflow's own start): the BPF wire accounting (attach it once on the experiment interface), the
fallback's tools, and the link engine that applies delay, jitter and loss. The runner checks the
same when it prepares a cell (and falls back to the /proc sampler with the reason, or refuses an
impairment it cannot apply); this tells the user first, node by node."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

from commscope.cluster.hosts import Host, on_all
from commscope.cluster.impair import DELAYER_MODULE
from commscope.cluster.machine import kernel_has_netem
from commscope.cluster.shaping import host_has_netem
from commscope.experiment.probes import build_wire_object, check_wire
from commscope.node.delayer import DelayerError, binary
from commscope.node.wire import WireError
from commscope.spec.link import IMPAIRMENT_AXES, choose_engine
from commscope.spec.settings import RunSettings

# What the nfqueue engine runs on a node besides the delayer, and the Debian package of each.
ENGINE_TOOLS = {"nft": "nftables", "iptables": "iptables"}


def engine_problem(requested: str, has_netem: bool, missing: list[str], build: str | None) -> str:
    """The message for a link engine that cannot run (pure): ``missing`` tools (names of
    :data:`ENGINE_TOOLS`), ``build`` the delayer's build error. '' when nothing is wrong."""
    try:
        engine = choose_engine(requested, has_netem)
    except ValueError as err:
        return str(err)
    if engine != "nfqueue":
        return ""
    parts = [f"{t} missing (Debian package {ENGINE_TOOLS[t]})" for t in missing]
    if build:
        parts.append(f"the NFQUEUE delayer cannot be built: {build}")
    if not parts:
        return ""
    axes = IMPAIRMENT_AXES
    return (
        f"sweep.{'/'.join(axes)}: cells with {', '.join(axes[:-1])} or {axes[-1]} need the "
        f"nfqueue link engine (run.link_engine={requested}, no netem here), which cannot run: "
        + "; ".join(parts)
    )


def local_engine_problem(requested: str) -> str:
    """:func:`engine_problem` for this machine (the netns cluster's nodes run here): probes
    netem, looks for nft and iptables, and builds the delayer (cached after the first time)."""
    has_netem = requested != "nfqueue" and kernel_has_netem()
    missing = [t for t in ENGINE_TOOLS if shutil.which(t) is None]
    build = None
    if choose_engine_or_none(requested, has_netem) == "nfqueue":
        try:
            binary()
        except DelayerError as err:
            build = str(err)
    return engine_problem(requested, has_netem, missing, build)


def choose_engine_or_none(requested: str, has_netem: bool) -> str | None:
    """:func:`~commscope.spec.link.choose_engine`, None where it refuses."""
    try:
        return choose_engine(requested, has_netem)
    except ValueError:
        return None


def node_engine_problem(host: Host, requested: str) -> str:
    """:func:`engine_problem` for ``host``: netem probed there, the tools and the delayer's
    build checked there (one round trip besides the netem probe)."""
    has_netem = requested != "nfqueue" and host_has_netem(host)
    if choose_engine_or_none(requested, has_netem) != "nfqueue":
        return engine_problem(requested, has_netem, [], None)
    py = shlex.quote(host.spec.python)
    script = "; ".join(
        f"PATH=$PATH:/usr/sbin:/sbin command -v {t} >/dev/null || echo @@missing {t}"
        for t in ENGINE_TOOLS
    )
    # The build's stderr through a command substitution: no file (a fixed or guessable name in
    # /tmp is one another user can plant a symbolic link at, and root writes through it).
    script += f"; why=$({py} -m {DELAYER_MODULE} build 2>&1 >/dev/null) || "
    script += '{ echo @@build; printf "%s\\n" "$why"; }'
    out = host.run(script, warn=True).stdout
    missing = [line.split()[1] for line in out.splitlines() if line.startswith("@@missing ")]
    build = out.split("@@build\n", 1)[1].strip() if "@@build\n" in out else None
    return engine_problem(requested, has_netem, missing, build)


def node_problems(host: Host, obj: Path | None, link_engine: str = "auto") -> list[str]:
    """What ``host`` lacks: the wire accounting (when ``obj`` was built), tcpdump and ethtool
    (the fallback's capture, the link facts), the link engine ``link_engine`` asks for. One
    line per problem, naming the fix."""
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
        engine = node_engine_problem(host, link_engine)
        if engine:
            problems.append(engine)
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
        found = on_all(hosts, lambda h: node_problems(h, obj, run.link_engine))
    return {h.name: ([why] if why else []) + p for h, p in zip(hosts, found, strict=True)}
