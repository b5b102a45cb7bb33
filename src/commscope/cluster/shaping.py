"""Link shaping with Linux tc on a node's experiment interface, in both directions, and the
node's TCP congestion control.

What goes where (``iface`` = the experiment interface, ``ifb`` = an IFB device on the node)::

    egress  (node sends)     iface root:  tbf rate R                      (cap only)
    ingress (node receives)  iface clsact, ingress hook, filters in prio order:
                               prio 1: free for the in-kernel wire accounting (a BPF filter)
                               prio 2: u32 match-all ─ mirred egress redirect → ifb
                             ifb root: tbf rate R                      (cap, no netem)
                                    or netem delay/jitter/loss         (netem, no cap)
                                    or netem ─ child 1:1 ─ tbf rate R  (both)
    the node's netns         net.ipv4.tcp_congestion_control = cc      (every shape, restored)

Delay, jitter and loss are one link model with two engines (``run.link_engine``): ``netem``
(above, on the ifb) where the kernel has it, or ``nfqueue`` where it does not: the cap stays on
the ifb and the impairments move to netfilter's prerouting hook of the node's namespace, an
nftables random drop and the NFQUEUE delayer (:mod:`commscope.cluster.impair`). Both apply
per direction on the receiver's ingress, so each node pair's RTT grows by 2 x delay.

Why delay/jitter/loss sit on the receiver's ingress and not on the sender's egress: netem on the
sender interacts with TCP Small Queues (the stack sees its packets "in the qdisc" for the whole
delay and throttles itself); the netem man page advises the ingress of the receiver via IFB.
The cap is on both sides so that each direction of a node's link is capped independently.

Why clsact and not the ingress qdisc: the wire accounting attaches tc BPF filters to clsact's
ingress and egress hooks at prio 1, and the two qdiscs exclude each other (tc: "Invalid qdisc
name: must match existing qdisc"). ``tc qdisc replace ... clsact`` on an existing clsact keeps
the filters already on it (checked), so shaping after the accounting attached is safe too. A
filter at prio 1 must return TC_ACT_UNSPEC (-1) on ingress: any verdict, TC_ACT_OK included,
ends classification and the redirect at prio 2 never runs (measured: with a BPF program
returning TC_ACT_OK at prio 1 the ifb saw 0 of 50 packets, with TC_ACT_UNSPEC all 50).
Lifecycle in a cell: shape → accounting attaches at prio 1 → training → accounting detaches →
unshape, which deletes clsact (and anything still on it) so the qdiscs return to their state
before shaping.

tbf quirks: the bucket (burst) must hold the largest packet the interface hands over and at
least rate x 1 ms, or tbf cannot reach its rate at Gbit speeds (measured here: 10 Gbit with a
32 KB burst gave 4.9 Gbit). With TSO/GSO off (the netns cluster's default) the largest packet is
a frame, MTU + 14 bytes, and the bucket is max(rate x 1 ms, 2 frames); with offloads on it is a
GSO super-packet of up to 64 KB and the bucket is max(rate x 1 ms, 64 KB), which at 50 Mbit/s
releases one 64 KB burst every ~10 ms instead of a steady stream of frames. Use ``tc qdisc
replace`` so re-applying is idempotent.

Commands are built by pure functions (unit tested for exact strings) and run on the node through
:class:`~commscope.cluster.hosts.Host` (with ``sudo -n`` when the SSH user is not root). The shape
itself and its parsers are plain data in :mod:`commscope.spec.link`.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from commscope.cluster import impair
from commscope.spec.link import NETEM_UNKNOWN, LinkShape, choose_engine, tc_ms, tc_num

if TYPE_CHECKING:
    # Annotations only: the analysis reads this module's constants (tbf_burst_bytes) and must
    # not pay for SSH (paramiko, fabric: 0.3 s) in every cell's metrics job.
    from commscope.cluster.hosts import Host

log = logging.getLogger(__name__)

# tbf queue bound expressed as time at the capped rate (tc's `latency`): deep enough that a
# single TCP flow keeps the bottleneck busy on a LAN, like a switch buffer of a few MB at 1 Gbit.
TBF_LATENCY_MS = 50
# The bucket floor when the interface passes GSO/TSO (or GRO) super-packets of up to 64 KB.
TBF_MIN_BURST_BYTES = 64 * 1024
# Without offloads: room for this many frames of MTU + Ethernet header (tc counts no FCS).
TBF_MIN_BURST_FRAMES = 2
ETH_HEADER_BYTES = 14
# netem holds every delayed packet; its default limit (1000 packets) would drop at
# Gbit rate x tens of ms of delay, so raise it well above any bandwidth-delay product we shape.
NETEM_LIMIT_PKTS = 100_000
# clsact ingress filters run by priority, lowest first. The redirect to the ifb sits at 2 so
# that prio 1 stays free for the wire accounting's BPF filter (commscope.node.wire), which must
# see packets before the redirect steals them.
REDIRECT_PRIO = 2
# The redirect gets a fixed handle so `tc filter replace` replaces it instead of stacking a second
# copy (tc assigns 800::801, 800::802, ... otherwise).
_INGRESS_FILTER_HANDLE = "800::800"
# The node's TCP congestion control: a sysctl of its network namespace (read without root).
CC_SYSCTL = "net.ipv4.tcp_congestion_control"
_CC_PROC = "/proc/sys/net/ipv4/tcp_congestion_control"

# tc error messages that mean "already in the wanted state" during cleanup.
_GONE_ERRORS = (
    "Cannot delete qdisc with handle of zero",  # root is the kernel default already
    "Cannot find specified qdisc on specified device",  # no ingress/clsact qdisc
    "Invalid handle",  # no ingress/clsact qdisc (this kernel's answer)
    # Deleting clsact where an ingress qdisc sits, or the reverse (they share handle ffff:):
    # the other one's own delete removes it.
    "Invalid qdisc name",
    "No such file or directory",
    "Cannot find device",  # the ifb was never created
)
_EXISTS_ERRORS = ("File exists",)


class ShapingError(RuntimeError):
    """A tc command failed on a node, or a node did not return to its unshaped state."""


class ShapingCannotRun(ShapingError):
    """The link setting cannot be installed on these nodes as they are (a congestion control
    the kernel lacks, nodes that would need different engines, a delayer that cannot be
    built): trying the cell again would fail the same way."""


def tbf_burst_bytes(rate_bps: int, mtu: int = 1500, offload: bool = False) -> int:
    """tbf bucket size in bytes: max(rate x 1 ms, largest packet room).

    The room is :data:`TBF_MIN_BURST_FRAMES` frames of ``mtu`` + 14 bytes when the interface
    carries frames (``offload`` False), 64 KB when it passes GSO super-packets (a packet that
    does not fit the bucket is segmented, or dropped when it is no GSO packet). Below rate x 1 ms
    the bucket empties faster than the timer refills it at high rates, and tbf falls short.
    """
    room = TBF_MIN_BURST_BYTES if offload else TBF_MIN_BURST_FRAMES * (mtu + ETH_HEADER_BYTES)
    return max(math.ceil(rate_bps / 8 / 1000), room)


def tbf_qdisc(rate_bps: int, mtu: int, offload: bool) -> str:
    """The tbf qdisc (tc words after the handle) that caps an interface at ``rate_bps``."""
    burst = tbf_burst_bytes(rate_bps, mtu, offload)
    return f"tbf rate {rate_bps}bit burst {burst} latency {TBF_LATENCY_MS}ms"


def _netem(shape: LinkShape) -> str:
    args = [f"netem limit {NETEM_LIMIT_PKTS}"]
    if shape.delay_ms or shape.jitter_ms:
        # Note: with jitter, netem reorders packets (each gets its own send time); TCP then sees
        # dupacks. That is what netem jitter means; sweep it knowingly.
        args.append(f"delay {tc_ms(shape.delay_ms)}")
        if shape.jitter_ms:
            args.append(tc_ms(shape.jitter_ms))
    if shape.loss_pct:
        args.append(f"loss {tc_num(shape.loss_pct)}%")
    return " ".join(args)


# ──────────────────────────────────────────────────────────────────────────── command builders


def shape_commands(
    iface: str,
    ifb: str,
    shape: LinkShape,
    *,
    mtu: int = 1500,
    offload: bool = False,
    engine: str = "netem",
) -> list[str]:
    """The tc commands (without sudo) that shape ``iface`` both ways; run in order.

    ``mtu``/``offload`` describe ``iface`` (they size the tbf buckets). ``engine`` is the
    impairment engine: with ``netem`` the delay, jitter and loss are tc's too; with ``nfqueue``
    only the cap is (the rest is :mod:`commscope.cluster.impair`'s). A shape with nothing for
    tc gives no commands; the congestion control is not tc's (:func:`cc_command`). ``ip link
    add`` may answer "File exists" and deleting a qdisc that is not there is fine.
    """
    netem = engine == "netem" and shape.impaired
    if shape.rate_bps is None and not netem:
        return []
    # The device names are quoted for the node's shell; the rest is numbers and tc keywords.
    iface, ifb = shlex.quote(iface), shlex.quote(ifb)
    tbf = None if shape.rate_bps is None else tbf_qdisc(shape.rate_bps, mtu, offload)
    cmds = [
        f"ip link add {ifb} type ifb",
        f"ip link set dev {ifb} up",
    ]
    if tbf is not None:
        cmds.append(f"tc qdisc replace dev {iface} root handle 1: {tbf}")
    else:
        # No cap: drop a cap left by a previous cell (replace cannot go back to "no qdisc").
        cmds.append(f"tc qdisc del dev {iface} root")
    # Everything received on iface is redirected through the ifb, where the receive-side
    # shaping lives (ingress hooks cannot queue, an ifb's root qdisc can). An ingress qdisc left
    # by an older commscope would block clsact: remove it first.
    cmds += [
        f"tc qdisc del dev {iface} ingress",
        f"tc qdisc replace dev {iface} clsact",
        f"tc filter replace dev {iface} ingress prio {REDIRECT_PRIO} "
        f"handle {_INGRESS_FILTER_HANDLE} protocol all u32 match u32 0 0 "
        f"action mirred egress redirect dev {ifb}",
    ]
    if netem:
        cmds.append(f"tc qdisc replace dev {ifb} root handle 1: {_netem(shape)}")
        if tbf is not None:
            cmds.append(f"tc qdisc replace dev {ifb} parent 1:1 handle 10: {tbf}")
    else:
        assert tbf is not None  # something for tc and no netem: there is a cap
        cmds.append(f"tc qdisc replace dev {ifb} root handle 1: {tbf}")
    return cmds


def unshape_commands(iface: str, ifb: str) -> list[str]:
    """The commands (without sudo) that return ``iface`` and ``ifb`` to their default qdiscs.

    Errors meaning "nothing there" (see ``_GONE_ERRORS``) are expected and tolerated. Deleting
    clsact also deletes every filter on it: the redirect, and an accounting filter that was not
    detached. The ingress qdisc is deleted too in case an older commscope left one. The ifb
    device itself is left in place.
    """
    iface, ifb = shlex.quote(iface), shlex.quote(ifb)
    return [
        f"tc qdisc del dev {iface} root",
        f"tc qdisc del dev {iface} clsact",
        f"tc qdisc del dev {iface} ingress",
        f"tc qdisc del dev {ifb} root",
    ]


def cc_command(cc: str) -> str:
    """The command (without sudo) that sets the node's TCP congestion control to ``cc``."""
    return f"sysctl -w {shlex.quote(f'{CC_SYSCTL}={cc}')}"


# ──────────────────────────────────────────────────────────────────────────── running on hosts


def _tc_prefix(host: Host) -> str:
    """``sudo -n `` for non-root SSH users (real hosts; -n: fail rather than ask a password)."""
    return "" if host.spec.user == "root" else "sudo -n "


def _run_script(host: Host, cmds: list[str], head: str = "", tail: str = "") -> str:
    """Run ``cmds`` in order on ``host`` in ONE remote shell (each SSH command costs a round trip
    plus a remote shell start: ~200 ms here, more across a WAN), between the raw shell lines
    ``head`` and ``tail``. Stops at the first failure that is not tolerated (see ``_tolerated``)
    and raises ShapingError naming that command (or the step ``tail`` names on its stderr's
    first line). Returns the script's stdout."""
    if not cmds and not head and not tail:
        return ""
    # The prefix and the commands are shell text on purpose: the builders above quote every
    # value in them (device names), the rest is tc's keywords and numbers.
    prefix = _tc_prefix(host)
    lines = [head] if head else []
    for cmd in cmds:
        full = prefix + cmd
        fail = f"{{ printf '%s\\n' {shlex.quote(cmd)} \"$out\" >&2; exit 3; }}"
        tolerated = _tolerated(cmd)
        if tolerated:
            pats = "|".join(f"*{shlex.quote(t)}*" for t in tolerated)
            lines.append(f'out=$({full} 2>&1) || case "$out" in {pats}) ;; *) {fail};; esac')
        else:
            lines.append(f"out=$({full} 2>&1) || {fail}")
    if tail:
        lines.append(tail)
    res = host.run("\n".join(lines), warn=True)
    if res.exited != 0:
        failed, _, err = (res.stderr or res.stdout).strip().partition("\n")
        raise ShapingError(f"{host.name}: `{failed}` failed: {err.strip() or '(no output)'}")
    return res.stdout


def _tolerated(cmd: str) -> tuple[str, ...]:
    """tc/ip errors that mean "already in the wanted state" for this command."""
    if cmd.startswith("ip link add"):
        return _EXISTS_ERRORS
    if " qdisc del " in f" {cmd}":
        return _GONE_ERRORS
    return ()


_NETEM_CACHE: dict[tuple[str, int, str | None], bool] = {}


def host_has_netem(host: Host) -> bool:
    """Whether the node's kernel has netem: adds one to the node's ifb device and removes it.

    Cached per node. Raises ShapingError when the probe fails for another reason.
    """
    key = (host.spec.ssh_host, host.spec.ssh_port, host.spec.netns)
    if key in _NETEM_CACHE:
        return _NETEM_CACHE[key]
    ifb, sudo = shlex.quote(host.spec.ifb_iface), _tc_prefix(host)
    # One round trip: make sure the ifb exists, try a netem on it, remove it again if it worked.
    probe = (
        f"{sudo}ip link add {ifb} type ifb 2>/dev/null; "
        f"out=$({sudo}tc qdisc add dev {ifb} root handle 1: netem 2>&1); rc=$?; "
        f"[ $rc -eq 0 ] && {sudo}tc qdisc del dev {ifb} root; "
        f'printf \'%s\\n%s\\n\' "$rc" "$out"; {sudo}tc -j qdisc show dev {ifb}'
    )
    res = host.run(probe, warn=True)
    rc, out, shown = (res.stdout.split("\n", 2) + ["", ""])[:3]
    if rc.strip() == "0":
        has = True
    elif NETEM_UNKNOWN in out:
        has = False
    elif "Exclusivity flag on" in out and '"kind":"netem"' in shown.replace(" ", ""):
        has = True  # a netem is already there (a shape not removed yet): that settles it
    else:
        raise ShapingError(
            f"{host.name}: netem probe on {ifb} failed: {out.strip() or res.stderr.strip()} "
            "(a qdisc left on the ifb? call remove_shape first)"
        )
    _NETEM_CACHE[key] = has
    return has


def engine_for(host: Host, shape: LinkShape, requested: str = "auto") -> str | None:
    """The engine that applies ``shape``'s delay, jitter and loss on ``host`` (``netem`` or
    ``nfqueue``, see :func:`~commscope.spec.link.choose_engine`), None when it has none.
    ValueError naming ``run.link_engine`` when ``requested`` cannot run there."""
    if not shape.impaired:
        return None
    return choose_engine(requested, host_has_netem(host) if requested != "nfqueue" else False)


def apply_shape(host: Host, shape: LinkShape, engine: str = "auto", seed: int = 0) -> str | None:
    """Shape ``host``'s experiment interface both ways and set its congestion control, in one
    round trip; return the impairment engine used (None without delay, jitter and loss).
    ``engine`` is ``run.link_engine``; ``seed`` seeds the delayer's jitter draws. A no-op shape
    removes any shaping (the congestion control is still set). On failure, unshape and raise
    (the caller restores the congestion control, see :func:`shaped`)."""
    used = engine_for(host, shape, engine)
    spec = host.spec
    tc = shape_commands(
        spec.exp_iface,
        spec.ifb_iface,
        shape,
        mtu=spec.mtu,
        offload=spec.offload,
        engine=used or "netem",
    ) or unshape_commands(spec.exp_iface, spec.ifb_iface)
    tail = ""
    if used == "nfqueue":
        tail = impair.apply_script(
            spec.exp_iface, _paths(host), shape, spec.python, _tc_prefix(host), seed
        )
    try:
        _run_script(host, [cc_command(shape.cc), *tc], tail=tail)
    except BaseException as exc:
        try:
            remove_shape(host)
        except Exception as cleanup_exc:  # keep the original error; log the cleanup one
            log.error("%s: unshaping after a failed apply also failed: %s", host.name, cleanup_exc)
        if isinstance(exc, ShapingError) and CC_SYSCTL in str(exc):
            raise ShapingCannotRun(f"{exc} ({_cc_hint(str(exc), shape.cc)})") from None
        if isinstance(exc, ShapingError) and "building the delayer" in str(exc):
            raise ShapingCannotRun(str(exc)) from None
        raise
    log.info("%s: shaped %s (%s, engine %s)", host.name, spec.exp_iface, shape.describe(), used)
    return used


def _paths(host: Host) -> impair.NodePaths:
    return impair.NodePaths(host.spec.workdir)


def _cc_hint(error: str, cc: str) -> str:
    """Why setting congestion control ``cc`` failed, and the fix."""
    if "Operation not permitted" in error:
        return (
            "a network namespace may only use an algorithm listed in the host's "
            f"net.ipv4.tcp_allowed_congestion_control: add {cc} there (provisioning the netns "
            "cluster does)"
        )
    return (
        f"the node's kernel lacks TCP congestion control {cc!r}: see "
        "/proc/sys/net/ipv4/tcp_available_congestion_control; for bbr, `modprobe tcp_bbr`"
    )


def remove_shape(host: Host, cc: str | None = None, check: bool = False) -> dict[str, Any]:
    """Return ``host``'s experiment interface and ifb to default qdiscs and remove the nfqueue
    engine's rules and delayer (idempotent); with ``cc``, also set the node's congestion control
    back to it (same round trip). Returns what the engine recorded (``delayer``: its exit
    statistics, ``loss``: the drop counters; empty when none ran) and ``leftovers``, the pieces of
    the engine still installed afterwards (should be empty); with ``check``, also ``after``: the
    node's :func:`link_state` once removed (same round trip)."""
    cmds = unshape_commands(host.spec.exp_iface, host.spec.ifb_iface)
    # The engine's removal first: it never fails, and the qdiscs' may.
    head = impair.remove_script(host.spec.exp_iface, _paths(host), _tc_prefix(host))
    tail = f"echo {_AFTER_MARK}; {_state_script(host)}" if check else ""
    out = _run_script(host, cmds + ([cc_command(cc)] if cc else []), head=head, tail=tail)
    out, _, after = out.partition(f"{_AFTER_MARK}\n")
    record, left = impair.parse_removal(out)
    return {**record, "leftovers": left, **({"after": _parse_state(host, after)} if check else {})}


_AFTER_MARK = "@@commscope-after-removal"


def impairment_leftovers(host: Host) -> list[str]:
    """The pieces of the nfqueue engine installed on ``host`` (nft table, iptables rule, delayer
    process); empty when there are none."""
    script = impair.leftovers_script(_paths(host), _tc_prefix(host))
    return impair.parse_leftovers(host.run(script, warn=True).stdout)


def congestion_control(host: Host) -> str:
    """The TCP congestion control new connections of ``host`` use (its network namespace's)."""
    return host.run(f"cat {_CC_PROC}").stdout.strip()


def _qdisc_script(host: Host, stats: bool = False) -> str:
    """Shell lines printing ``tc [-s] -j qdisc show`` of the experiment interface and the ifb
    between markers, for :func:`_parse_qdiscs`."""
    devs = (host.spec.exp_iface, host.spec.ifb_iface)
    flag = "-s " if stats else ""
    return "; ".join(
        f"echo @@{i}; tc {flag}-j qdisc show dev {shlex.quote(dev)} 2>&1; echo @@rc $?"
        for i, dev in enumerate(devs)
    )


def _parse_qdiscs(host: Host, stdout: str) -> dict[str, list[dict] | None]:
    """Each device of :func:`_qdisc_script`'s output mapped to its parsed qdiscs, or None when
    the device does not exist."""
    out: dict[str, list[dict] | None] = {}
    for i, dev in enumerate((host.spec.exp_iface, host.spec.ifb_iface)):
        block = stdout.split(f"@@{i}\n", 1)[1].split("@@rc ", 1)
        body, rc = block[0].strip(), block[1].split()[0]
        if rc != "0":
            if "Cannot find device" in body:
                out[dev] = None
                continue
            raise ShapingError(f"{host.name}: tc qdisc show dev {dev} failed: {body}")
        out[dev] = json.loads(body) if body else []
    return out


def _qdisc_json(host: Host, stats: bool = False) -> dict[str, list[dict] | None]:
    """``tc [-s] -j qdisc show`` of the experiment interface and the ifb, in one round trip."""
    return _parse_qdiscs(host, host.run(_qdisc_script(host, stats), warn=True).stdout)


def qdisc_snapshot(host: Host) -> str:
    """Normalised qdisc state of the experiment interface and the ifb, for equality checks.

    Qdiscs the kernel attaches by itself have handle ``0:`` (noqueue, pfifo_fast, mq, ...);
    they are summarised as ``default``, so "ifb absent" and "ifb with its default qdisc" compare
    equal, and so do a veth's noqueue before and after shaping. Anything else is listed.
    """
    return _snapshot(_qdisc_json(host))


def _snapshot(qdiscs_by_dev: dict[str, list[dict] | None]) -> str:
    lines = []
    for dev, qdiscs in qdiscs_by_dev.items():
        custom = [q for q in (qdiscs or []) if q.get("handle") != "0:"]
        if not custom:
            lines.append(f"{dev}: default")
        for q in custom:
            where = "root" if q.get("root") else f"parent {q.get('parent', '?')}"
            opts = json.dumps(q.get("options", {}), sort_keys=True)
            lines.append(f"{dev}: {q.get('kind')} {q.get('handle')} {where} {opts}")
    return "\n".join(lines)


def _state_script(host: Host) -> str:
    """Shell lines printing what :func:`link_state` returns, for :func:`_parse_state`."""
    left = impair.leftovers_script(_paths(host), _tc_prefix(host))
    return f"{_qdisc_script(host)}; echo @@cc; cat {_CC_PROC}; echo @@left; {left}"


def _parse_state(host: Host, stdout: str) -> tuple[str, str, list[str]]:
    qdiscs, _, rest = stdout.partition("@@cc\n")
    cc, _, left = rest.partition("@@left\n")
    return _snapshot(_parse_qdiscs(host, qdiscs)), cc.strip(), impair.parse_leftovers(left)


def link_state(host: Host) -> tuple[str, str, list[str]]:
    """``host``'s :func:`qdisc_snapshot`, :func:`congestion_control` and
    :func:`impairment_leftovers`, in one round trip."""
    return _parse_state(host, host.run(_state_script(host), warn=True).stdout)


def qdisc_stats(host: Host) -> list[dict]:
    """Counters of every qdisc on the experiment interface and the ifb (see
    :func:`parse_qdisc_stats`), in one round trip."""
    return parse_qdisc_stats(host, host.run(qdisc_stats_script(host), warn=True).stdout)


def qdisc_stats_script(host: Host) -> str:
    """Shell lines printing :func:`qdisc_stats`'s input (to share a round trip with others)."""
    return _qdisc_script(host, stats=True)


def parse_qdisc_stats(host: Host, stdout: str) -> list[dict]:
    """Counters of every qdisc on the experiment interface and the ifb.

    One dict per qdisc: dev, kind, handle, parent ("root" for root qdiscs), bytes and packets
    sent (tbf/netem count L2 frames without FCS), drops, overlimits, requeues, backlog (bytes)
    and qlen (packets).
    """
    out: list[dict] = []
    for dev, qdiscs in _parse_qdiscs(host, stdout).items():
        for q in qdiscs or []:
            out.append(
                {
                    "dev": dev,
                    "kind": q.get("kind"),
                    "handle": q.get("handle"),
                    "parent": "root" if q.get("root") else q.get("parent"),
                    "bytes": int(q.get("bytes", 0)),
                    "packets": int(q.get("packets", 0)),
                    "drops": int(q.get("drops", 0)),
                    "overlimits": int(q.get("overlimits", 0)),
                    "requeues": int(q.get("requeues", 0)),
                    "backlog": int(q.get("backlog", 0)),
                    "qlen": int(q.get("qlen", 0)),
                }
            )
    return out


@contextmanager
def shaped(
    hosts: list[Host],
    shape: LinkShape,
    engine: str = "auto",
    seed: int = 0,
    per_host: Mapping[str, LinkShape] | None = None,
) -> Iterator[dict[str, Any]]:
    """Shape every host and set its congestion control for the duration of the block; ALWAYS
    unshape and restore the congestion control afterwards. ``per_host`` gives a host (by name)
    a shape of its own in place of ``shape`` (a heterogeneous link: spec.topology overrides).

    ``engine`` is ``run.link_engine`` and ``seed`` seeds the jitter draws (node i uses
    ``seed + i``). Yields the link record, a dict filled as the cell goes: ``engine`` (the
    impairment engine every node used, None without delay, jitter and loss), ``requested``, and
    after the block ``nodes`` (each node's engine record: the delayer's statistics, the loss
    counters). Unshaping runs on every host whatever happened (exception in the block, apply
    failing on the third host, Ctrl-C), then each host's qdisc snapshot and congestion control
    must equal those taken before shaping and no piece of the nfqueue engine may be left, else
    ShapingError (chained to the block's exception, if any).
    """
    from commscope.cluster.hosts import on_all  # SSH only where links are shaped

    # Refuse before anything is touched: never emulate a delay by silently dropping it.
    shapes = {h.name: (per_host or {}).get(h.name, shape) for h in hosts}
    used = {e for e in on_all(hosts, lambda h: engine_for(h, shapes[h.name], engine)) if e}
    if not used:
        used = {None}
    if len(used) > 1:
        raise ShapingCannotRun(
            f"the cell's nodes would use different link engines ({sorted(map(str, used))}): "
            "set run.link_engine to nfqueue so that every node runs the same one"
        )
    record: dict[str, Any] = {"engine": used.pop(), "requested": engine, "nodes": {}}

    def clean_state(h: Host) -> tuple[str, str, list[str]]:
        snap, cc, left = link_state(h)
        if left:
            # A crashed run's delay or loss would silently impair this cell: remove it first
            # (the qdiscs such a run left are replaced by the apply below anyway).
            log.warning("%s has a link engine left by an earlier run: %s", h.name, "; ".join(left))
            snap, cc, left = remove_shape(h, check=True)["after"]
        return snap, cc, left

    # Per-node steps run concurrently (on_all): each is an SSH round trip.
    before = {h.name: st for h, st in zip(hosts, on_all(hosts, clean_state), strict=True)}
    for name, (snap, _, left) in before.items():
        if any(not line.endswith(": default") for line in snap.splitlines()):
            log.warning("%s already has non-default qdiscs before shaping:\n%s", name, snap)
        if left:
            raise ShapingError(f"{name}: cannot remove an earlier run's link engine: {left}")
    index = {h.name: i for i, h in enumerate(hosts)}
    applied = False
    try:
        on_all(hosts, lambda h: apply_shape(h, shapes[h.name], engine, seed + index[h.name]))
        applied = True
        yield record
    finally:

        def unshape_and_check(h: Host) -> str | None:
            snap_before, cc_before, _ = before[h.name]
            try:
                removed = remove_shape(h, cc=cc_before, check=True)
            except Exception as exc:  # carry on: every other host must still be unshaped
                return f"{h.name}: unshape failed: {exc}"
            left = removed.pop("leftovers")
            after, cc_after, _ = removed.pop("after")
            if removed:
                record["nodes"][h.name] = removed
            # --queue-bypass lets packets through undelayed once the delayer is gone: one that
            # died during the cell (no exit statistics) took the delay with it.
            own = shapes[h.name]
            delayed = (
                applied and record["engine"] == "nfqueue" and bool(own.delay_ms or own.jitter_ms)
            )
            if delayed and "delayer" not in removed:
                return (
                    f"{h.name}: the delayer left no statistics: it died during the cell, "
                    f"and its packets passed undelayed from then on (see "
                    f"{impair.NodePaths(h.spec.workdir).log})"
                )
            if after != snap_before:
                return (
                    f"{h.name}: qdiscs not back to their pre-shaping state.\n"
                    f"before:\n{snap_before}\nafter:\n{after}"
                )
            if cc_after != cc_before:
                return f"{h.name}: congestion control is {cc_after}, was {cc_before} before"
            if left:
                return f"{h.name}: the link engine is still installed: {'; '.join(left)}"
            return None

        problems = [p for p in on_all(hosts, unshape_and_check) if p]
        if problems:
            raise ShapingError("unshaping left the cluster dirty:\n" + "\n".join(problems))


# ──────────────────────────────────────────────────────────────────────────── link facts

# `ethtool -k` feature names of the offloads that decide what size of packet the stack hands
# the interface (tso, gso) and what it hands up on receive (gro).
_OFFLOAD_FEATURES = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
}


def parse_link_facts(iface: str, output: str) -> dict[str, Any]:
    """:func:`link_facts` from its script's output (pure; see there for the keys)."""
    mtu_text, _, rest = output.partition("@@ethtool\n")
    features_text, _, cc_text = rest.partition("@@cc\n")
    features: dict[str, str] = {}
    for line in features_text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep:
            features[name] = value.split()[0] if value.split() else ""
    facts: dict[str, Any] = {"iface": iface}
    mtu = mtu_text.strip()
    facts["mtu"] = int(mtu) if mtu.isdigit() else None
    for key, feature in _OFFLOAD_FEATURES.items():
        value = features.get(feature)
        facts[key] = None if value not in ("on", "off") else value == "on"
    facts["cc"] = cc_text.strip() or None
    return facts


def link_facts(host: Host) -> dict[str, Any]:
    """What ``host``'s experiment link is right now, for the run's record, in one round trip:
    ``iface``, ``mtu`` (int), ``tso``/``gso``/``gro`` (bool: offloads on, so counters and tcpdump
    see packets of up to 64 KB, not frames; None when ``ethtool`` is missing) and ``cc`` (the
    TCP congestion control new connections get; inside :func:`shaped`, the cell's).

    Works on both backends and needs no root (``ethtool -k`` only reads)."""
    out = host.run(link_facts_script(host), warn=True).stdout
    return parse_link_facts(host.spec.exp_iface, out)


def link_facts_script(host: Host) -> str:
    """Shell lines printing :func:`parse_link_facts`'s input (to share a round trip)."""
    iface = shlex.quote(host.spec.exp_iface)
    return (
        f"cat /sys/class/net/{iface}/mtu; echo @@ethtool; "
        # Non-root SSH users often lack /usr/sbin in PATH, where ethtool lives.
        f"PATH=$PATH:/usr/sbin:/sbin ethtool -k {iface} 2>&1; echo @@cc; cat {_CC_PROC}"
    )
