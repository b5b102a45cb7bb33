"""Link shaping with Linux tc on a node's experiment interface, in both directions.

What goes where (``iface`` = the experiment interface, ``ifb`` = an IFB device on the node)::

    egress  (node sends)     iface root:  tbf rate R                      (cap only)
    ingress (node receives)  iface ingress qdisc + u32 match-all filter
                             └─ mirred egress redirect → ifb
                                ifb root: tbf rate R                      (cap, no netem)
                                       or netem delay/jitter/loss         (netem, no cap)
                                       or netem ─ child 1:1 ─ tbf rate R  (both)

Why delay/jitter/loss sit on the receiver's ingress and not on the sender's egress: netem on the
sender interacts with TCP Small Queues (the stack sees its packets "in the qdisc" for the whole
delay and throttles itself); the netem man page advises the ingress of the receiver via IFB.
The cap is on both sides so that each direction of a node's link is capped independently.

tbf quirks: the burst must be at least max(rate x 1 ms, 64 KB) or tbf cannot reach its rate at
Gbit speeds and splits GSO super-packets needlessly (measured here: 10 Gbit with a 32 KB burst
gave 4.9 Gbit); use ``tc qdisc replace`` so re-applying is idempotent.

Commands are built by pure functions (unit tested for exact strings) and run on the node through
:class:`~commscope.cluster.hosts.Host` (with ``sudo -n`` when the SSH user is not root). The shape
itself and its parsers are plain data in :mod:`commscope.spec.link`.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from commscope.cluster.hosts import Host, on_all
from commscope.spec.link import NETEM_UNKNOWN, LinkShape, check_shape_supported, tc_ms, tc_num

log = logging.getLogger(__name__)

# tbf queue bound expressed as time at the capped rate (tc's `latency`): deep enough that a
# single TCP flow keeps the bottleneck busy on a LAN, like a switch buffer of a few MB at 1 Gbit.
TBF_LATENCY_MS = 50
TBF_MIN_BURST_BYTES = 64 * 1024
# netem holds every delayed packet; its default limit (1000 packets) would drop at
# Gbit rate x tens of ms of delay, so raise it well above any bandwidth-delay product we shape.
NETEM_LIMIT_PKTS = 100_000
# The u32 filter on the ingress qdisc gets a fixed handle so `tc filter replace` replaces it
# instead of stacking a second copy (tc assigns 800::801, 800::802, ... otherwise).
_INGRESS_FILTER_HANDLE = "800::800"

# tc error messages that mean "already in the wanted state" during cleanup.
_GONE_ERRORS = (
    "Cannot delete qdisc with handle of zero",  # root is the kernel default already
    "Cannot find specified qdisc on specified device",  # no ingress qdisc
    "Invalid handle",  # no ingress qdisc (older iproute2/kernels)
    "No such file or directory",
    "Cannot find device",  # the ifb was never created
)
_EXISTS_ERRORS = ("File exists",)


class ShapingError(RuntimeError):
    """A tc command failed on a node, or a node did not return to its unshaped state."""


def tbf_burst_bytes(rate_bps: int) -> int:
    """tbf bucket size: max(rate x 1 ms, 64 KB) in bytes.

    Below 64 KB a single GSO super-packet (up to 64 KB) does not fit the bucket and tbf has to
    segment it; below rate x 1 ms the bucket empties faster than the timer refills it at high
    rates, and tbf falls short of its rate.
    """
    return max(math.ceil(rate_bps / 8 / 1000), TBF_MIN_BURST_BYTES)


def _tbf(rate_bps: int) -> str:
    return f"tbf rate {rate_bps}bit burst {tbf_burst_bytes(rate_bps)} latency {TBF_LATENCY_MS}ms"


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


def shape_commands(iface: str, ifb: str, shape: LinkShape) -> list[str]:
    """The commands (without sudo) that shape ``iface`` both ways; run in order.

    A no-op shape gives no commands. ``ip link add`` may answer "File exists" (fine).
    """
    if shape.is_noop:
        return []
    cmds = [
        f"ip link add {ifb} type ifb",
        f"ip link set dev {ifb} up",
    ]
    if shape.rate_bps is not None:
        cmds.append(f"tc qdisc replace dev {iface} root handle 1: {_tbf(shape.rate_bps)}")
    else:
        # No cap: drop a cap left by a previous cell (replace cannot go back to "no qdisc").
        cmds.append(f"tc qdisc del dev {iface} root")
    # Everything received on iface is redirected through the ifb, where the receive-side
    # shaping lives (ingress qdiscs cannot queue, an ifb's root qdisc can).
    cmds += [
        f"tc qdisc replace dev {iface} handle ffff: ingress",
        f"tc filter replace dev {iface} parent ffff: protocol all prio 1 "
        f"handle {_INGRESS_FILTER_HANDLE} u32 match u32 0 0 "
        f"action mirred egress redirect dev {ifb}",
    ]
    if shape.needs_netem:
        cmds.append(f"tc qdisc replace dev {ifb} root handle 1: {_netem(shape)}")
        if shape.rate_bps is not None:
            cmds.append(f"tc qdisc replace dev {ifb} parent 1:1 handle 10: {_tbf(shape.rate_bps)}")
    else:
        assert shape.rate_bps is not None  # not a no-op and no netem: there is a cap
        cmds.append(f"tc qdisc replace dev {ifb} root handle 1: {_tbf(shape.rate_bps)}")
    return cmds


def unshape_commands(iface: str, ifb: str) -> list[str]:
    """The commands (without sudo) that return ``iface`` and ``ifb`` to their default qdiscs.

    Errors meaning "nothing there" (see ``_GONE_ERRORS``) are expected and tolerated. Deleting
    the ingress qdisc also deletes its redirect filter. The ifb device itself is left in place.
    """
    return [
        f"tc qdisc del dev {iface} root",
        f"tc qdisc del dev {iface} ingress",
        f"tc qdisc del dev {ifb} root",
    ]


# ──────────────────────────────────────────────────────────────────────────── running on hosts


def _tc_prefix(host: Host) -> str:
    """``sudo -n `` for non-root SSH users (real hosts; -n: fail rather than ask a password)."""
    return "" if host.spec.user == "root" else "sudo -n "


def _run_script(host: Host, cmds: list[str]) -> None:
    """Run ``cmds`` in order on ``host`` in ONE remote shell (each SSH command costs a round trip
    plus a remote shell start: ~200 ms here, more across a WAN). Stops at the first failure that
    is not tolerated (see ``_tolerated``) and raises ShapingError naming that command."""
    if not cmds:
        return
    prefix = _tc_prefix(host)
    lines = []
    for cmd in cmds:
        full = prefix + cmd
        fail = f"{{ printf '%s\\n' {shlex.quote(cmd)} \"$out\" >&2; exit 3; }}"
        tolerated = _tolerated(cmd)
        if tolerated:
            pats = "|".join(f"*{shlex.quote(t)}*" for t in tolerated)
            lines.append(f'out=$({full} 2>&1) || case "$out" in {pats}) ;; *) {fail};; esac')
        else:
            lines.append(f"out=$({full} 2>&1) || {fail}")
    res = host.run("\n".join(lines), warn=True)
    if res.exited != 0:
        failed, _, err = (res.stderr or res.stdout).strip().partition("\n")
        raise ShapingError(f"{host.name}: `{failed}` failed: {err.strip() or '(no output)'}")


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
    ifb, sudo = host.spec.ifb_iface, _tc_prefix(host)
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


def apply_shape(host: Host, shape: LinkShape) -> None:
    """Shape ``host``'s experiment interface both ways. On failure, unshape and raise."""
    if shape.needs_netem:
        check_shape_supported(shape, host_has_netem(host))
    if shape.is_noop:
        remove_shape(host)
        return
    try:
        _run_script(host, shape_commands(host.spec.exp_iface, host.spec.ifb_iface, shape))
    except BaseException:
        try:
            remove_shape(host)
        except Exception as exc:  # keep the original error; log the cleanup one
            log.error("%s: unshaping after a failed apply also failed: %s", host.name, exc)
        raise
    log.info("%s: shaped %s (%s)", host.name, host.spec.exp_iface, shape.describe())


def remove_shape(host: Host) -> None:
    """Return ``host``'s experiment interface and ifb to default qdiscs (idempotent)."""
    _run_script(host, unshape_commands(host.spec.exp_iface, host.spec.ifb_iface))


def _qdisc_json(host: Host, stats: bool = False) -> dict[str, list[dict] | None]:
    """``tc [-s] -j qdisc show`` of the experiment interface and the ifb, in one round trip.

    Maps each device to its parsed qdiscs, or None when the device does not exist.
    """
    devs = (host.spec.exp_iface, host.spec.ifb_iface)
    flag = "-s " if stats else ""
    script = "; ".join(
        f"echo @@{i}; tc {flag}-j qdisc show dev {dev} 2>&1; echo @@rc $?"
        for i, dev in enumerate(devs)
    )
    res = host.run(script, warn=True)
    out: dict[str, list[dict] | None] = {}
    for i, dev in enumerate(devs):
        block = res.stdout.split(f"@@{i}\n", 1)[1].split("@@rc ", 1)
        body, rc = block[0].strip(), block[1].split()[0]
        if rc != "0":
            if "Cannot find device" in body:
                out[dev] = None
                continue
            raise ShapingError(f"{host.name}: tc qdisc show dev {dev} failed: {body}")
        out[dev] = json.loads(body) if body else []
    return out


def qdisc_snapshot(host: Host) -> str:
    """Normalised qdisc state of the experiment interface and the ifb, for equality checks.

    Qdiscs the kernel attaches by itself have handle ``0:`` (noqueue, pfifo_fast, mq, ...);
    they are summarised as ``default``, so "ifb absent" and "ifb with its default qdisc" compare
    equal, and so do a veth's noqueue before and after shaping. Anything else is listed.
    """
    lines = []
    for dev, qdiscs in _qdisc_json(host).items():
        custom = [q for q in (qdiscs or []) if q.get("handle") != "0:"]
        if not custom:
            lines.append(f"{dev}: default")
        for q in custom:
            where = "root" if q.get("root") else f"parent {q.get('parent', '?')}"
            opts = json.dumps(q.get("options", {}), sort_keys=True)
            lines.append(f"{dev}: {q.get('kind')} {q.get('handle')} {where} {opts}")
    return "\n".join(lines)


def qdisc_stats(host: Host) -> list[dict]:
    """Counters of every qdisc on the experiment interface and the ifb.

    One dict per qdisc: dev, kind, handle, parent ("root" for root qdiscs), bytes and packets
    sent (tbf/netem count L2 frames without FCS), drops, overlimits, requeues, backlog (bytes)
    and qlen (packets).
    """
    out: list[dict] = []
    for dev, qdiscs in _qdisc_json(host, stats=True).items():
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
def shaped(hosts: list[Host], shape: LinkShape) -> Iterator[None]:
    """Shape every host for the duration of the block; ALWAYS unshape afterwards.

    Unshaping runs on every host whatever happened (exception in the block, apply failing on
    the third host, Ctrl-C), then each host's qdisc snapshot must equal the one taken before
    shaping, else ShapingError (chained to the block's exception, if any).
    """
    # Per-node steps run concurrently (on_all): each is an SSH round trip.
    before = dict(zip([h.name for h in hosts], on_all(hosts, qdisc_snapshot), strict=True))
    for name, snap in before.items():
        if any(not line.endswith(": default") for line in snap.splitlines()):
            log.warning("%s already has non-default qdiscs before shaping:\n%s", name, snap)
    try:
        on_all(hosts, lambda h: apply_shape(h, shape))
        yield
    finally:

        def unshape_and_check(h: Host) -> str | None:
            try:
                remove_shape(h)
            except Exception as exc:  # carry on: every other host must still be unshaped
                return f"{h.name}: unshape failed: {exc}"
            try:
                after = qdisc_snapshot(h)
            except Exception as exc:
                return f"{h.name}: cannot read qdiscs after unshaping: {exc}"
            if after != before[h.name]:
                return (
                    f"{h.name}: qdiscs not back to their pre-shaping state.\n"
                    f"before:\n{before[h.name]}\nafter:\n{after}"
                )
            return None

        problems = [p for p in on_all(hosts, unshape_and_check) if p]
        if problems:
            raise ShapingError("unshaping left the cluster dirty:\n" + "\n".join(problems))
