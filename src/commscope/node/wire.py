"""In-kernel wire accounting of one node: the tc BPF program of ``wire.bpf.c``, built, attached,
drained and detached.

``python -m commscope.node.wire run --iface exp0 --obj wire.bpf.o --bin-ns 100000 --slots 32768
--peers 198.19.0.1,198.19.0.2 --out wire.parquet --meta wire.json``

attaches the program on clsact ingress and egress of ``--iface`` (prio 1, before the shaper's
redirect at prio 2), fills its peer map with the cluster's experiment addresses, drains finished
bins from the ring every ``--poll-s`` (the array is memory-mapped: no syscall per read, it
copies the bins out and zeroes them), and on SIGTERM/SIGINT
(or ``--max-seconds``) reads the last bins, detaches, and writes one row per non-empty (bin, hook,
peer) to ``--out`` (columns :data:`~commscope.contracts.WIRE_BIN_COLUMNS`, ``t_ns`` the bin's
start on CLOCK_REALTIME) and its metadata to ``--meta`` (bin width, the monotonic-to-realtime
offset measured at start and end, totals per hook, the interface counters at attach and detach,
ring overruns). Both are renamed into place, so the orchestrator can wait for the names.

``python -m commscope.node.wire check --iface exp0 --obj wire.bpf.o`` attaches and detaches
once and says why it cannot, if it cannot (exit 1): the orchestrator then falls back to the /proc
sampler and says so.

The object is built on the orchestrator (:func:`build_object`, clang from the kernel's uapi
headers and libbpf's bpf_helpers.h) and shipped to the nodes; the nodes need only tc (iproute2
with libbpf, for BTF-defined maps) and root. Nothing is pinned: each load owns its maps, which
this program finds through the attached program's id (``tc -j filter show``), so nothing is left
in a bpffs when it stops, and a crashed run's filters go with the clsact the unshaping removes.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commscope.node.native import own_file, private_dir
from commscope.node.sampler import interface_fields

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

SOURCE = Path(__file__).with_name("wire.bpf.c")
HOOKS = ("ingress", "egress")
# The tc filter priority and handle of the accounting: before the shaper's redirect (prio 2).
PRIO = 1
HANDLE = 1
# The ring holds this many seconds of bins at least; the reader drains it ~8 times per lap.
RING_SECONDS = 2.0
DEFAULT_POLL_S = 0.25
# One struct bin of wire.bpf.c: bytes, packets, gso_extra (native u64).
_BIN_FIELDS = 3
# The reader leaves the newest bins alone: a packet stamped in a bin may still be adding to it.
_GUARD_BINS = 2

# bpf(2) commands and the layout of the parts of union bpf_attr / bpf_*_info used here.
_BPF_MAP_UPDATE_ELEM = 2
_BPF_PROG_GET_FD_BY_ID = 13
_BPF_MAP_GET_FD_BY_ID = 14
_BPF_OBJ_GET_INFO_BY_FD = 15
_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_PROG_INFO_SIZE = 80  # up to and including name[16]: nr_map_ids at 52, map_ids at 56
_MAP_INFO_SIZE = 40  # up to and including name[16] at 24


class WireError(RuntimeError):
    """The accounting cannot run here (no clang, no tc BPF support, not root, ...): the message
    says what is missing, for the log and the report."""


# ──────────────────────────────────────────────────────────────────────────── build


def ring_slots(bin_ns: int, seconds: float = RING_SECONDS) -> int:
    """Ring length in bins: the next power of two holding at least ``seconds`` of bins."""
    need = max(1, int(seconds * 1e9 // bin_ns))
    return 1 << (need - 1).bit_length()


def _multiarch_include() -> list[str]:
    """clang -target bpf does not search Debian's multiarch include dir (asm/types.h lives
    there); ask the host compiler for it."""
    for cc in ("gcc", "cc"):
        if shutil.which(cc):
            res = subprocess.run([cc, "-print-multiarch"], capture_output=True, text=True)
            triple = res.stdout.strip()
            if res.returncode == 0 and triple and Path(f"/usr/include/{triple}").is_dir():
                return [f"-I/usr/include/{triple}"]
    return []


def build_object(
    bin_ns: int, slots: int, max_peers: int, cache_dir: Path, source: Path = SOURCE
) -> Path:
    """Compile ``wire.bpf.c`` for these parameters into ``cache_dir`` (reused when the source
    and parameters are unchanged: the name carries their hash) and return the object's path.
    Root loads it on every node, so the cache must be private to this user (created with mode
    0700, :func:`~commscope.node.native.private_dir`) and a cached object is reused only while
    it is this user's file that nobody else can write (else it is built again).

    Raises WireError naming what is missing (clang, headers) with the compiler's message, or
    why the cache is not private."""
    if slots & (slots - 1) or slots <= 0:
        raise ValueError(f"slots={slots} must be a power of two")
    defines = [f"-DBIN_NS={int(bin_ns)}ULL", f"-DRING_SLOTS={slots}", f"-DMAX_PEERS={max_peers}"]
    digest = hashlib.sha256(source.read_bytes() + " ".join(defines).encode()).hexdigest()[:16]
    why = private_dir(Path(cache_dir))
    if why:
        raise WireError(
            f"the BPF object cache {cache_dir} is not private ({why}): another user could swap "
            "the object root loads; remove it, or use a directory only this user can write"
        )
    obj = Path(cache_dir) / f"commscope-wire-{digest}.bpf.o"
    if own_file(obj):
        return obj
    clang = shutil.which(os.environ.get("BPF_CLANG") or "clang")
    if clang is None:
        raise WireError(
            f"{os.environ.get('BPF_CLANG') or 'clang'} not found on the orchestrator: install "
            "clang, llvm and libbpf-dev (envs/bootstrap.sh does) to build the BPF wire accounting"
        )
    tmp = obj.with_name(f"{obj.name}.{os.getpid()}.tmp")
    cmd = [clang, "-O2", "-g", "-target", "bpf", *_multiarch_include(), *defines]
    res = subprocess.run(
        [*cmd, "-c", str(source), "-o", str(tmp)], capture_output=True, text=True, timeout=120
    )
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise WireError(f"clang could not build {source.name}: {res.stderr.strip()[-800:]}")
    tmp.chmod(0o600)  # whatever the umask: own_file() accepts it next time
    tmp.rename(obj)  # atomic: concurrent builds never see half an object
    return obj


# ──────────────────────────────────────────────────────────────────────────── bpf(2)


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise WireError(f"bpf() syscall number unknown on {os.uname().machine}")
    ret = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(cmd {cmd}): {os.strerror(err)}")
    return ret


def _attr(fmt: str, *values: Any) -> ctypes.Array:
    buf = ctypes.create_string_buffer(128)  # union bpf_attr, zero-filled
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _addr(obj: ctypes.Array | Any) -> int:
    return ctypes.addressof(obj)


def _fd_by_id(cmd: int, obj_id: int) -> int:
    return _bpf(cmd, _attr("=III", obj_id, 0, 0))


def _info(fd: int, size: int, prefill: bytes = b"") -> ctypes.Array:
    info = ctypes.create_string_buffer(prefill.ljust(size, b"\0"), size)
    _bpf(_BPF_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, size, _addr(info)))
    return info


def prog_maps(prog_id: int) -> dict[str, int]:
    """The maps of a loaded program, ``{name: fd}`` (the caller closes the fds)."""
    prog_fd = _fd_by_id(_BPF_PROG_GET_FD_BY_ID, prog_id)
    try:
        ids = (ctypes.c_uint32 * 16)()
        prefill = bytearray(_PROG_INFO_SIZE)
        struct.pack_into("=IQ", prefill, 52, len(ids), _addr(ids))
        info = _info(prog_fd, _PROG_INFO_SIZE, bytes(prefill))
        (count,) = struct.unpack_from("=I", info, 52)
    finally:
        os.close(prog_fd)
    maps = {}
    for map_id in list(ids)[: min(count, len(ids))]:
        fd = _fd_by_id(_BPF_MAP_GET_FD_BY_ID, map_id)
        name = _info(fd, _MAP_INFO_SIZE).raw[24:40].split(b"\0", 1)[0].decode()
        maps[name] = fd
    return maps


_PROG_STATS_AT = 192  # bpf_prog_info.run_time_ns, then run_cnt (kernel.bpf_stats_enabled=1)


def prog_stats(prog_id: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program: the kernel's own account of the time spent
    in it, kept while ``kernel.bpf_stats_enabled`` is 1 (0, 0 otherwise)."""
    fd = _fd_by_id(_BPF_PROG_GET_FD_BY_ID, prog_id)
    try:
        info = _info(fd, _PROG_STATS_AT + 16)
    finally:
        os.close(fd)
    run_time_ns, run_cnt = struct.unpack_from("=QQ", info, _PROG_STATS_AT)
    return run_time_ns, run_cnt


def map_update(fd: int, key: bytes, value: bytes) -> None:
    """Set one element (BPF_ANY)."""
    k, v = (
        ctypes.create_string_buffer(key, len(key)),
        ctypes.create_string_buffer(value, len(value)),
    )
    _bpf(_BPF_MAP_UPDATE_ELEM, _attr("=IIQQQ", fd, 0, _addr(k), _addr(v), 0))


# ──────────────────────────────────────────────────────────────────────────── tc


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["tc", *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise WireError(f"`tc {' '.join(args)}` failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def attach(iface: str, obj: Path) -> tuple[bool, dict[str, int]]:
    """Attach the program on both hooks of ``iface``; returns (whether this created the clsact
    qdisc, ``{hook: prog id}``). ``replace`` takes over a filter a killed run left behind."""
    res = _tc("qdisc", "add", "dev", iface, "clsact", check=False)
    created = res.returncode == 0
    # A clsact already there (the shaper's) answers "Exclusivity flag on" or "File exists".
    if not created and not any(m in res.stderr for m in ("File exists", "Exclusivity flag on")):
        raise WireError(f"cannot add clsact on {iface}: {res.stderr.strip()}")
    prog_ids = {}
    try:
        for hook in HOOKS:
            _tc("filter", "replace", "dev", iface, hook, "prio", str(PRIO), "handle", str(HANDLE),
                "bpf", "da", "obj", str(obj), "sec", f"tc/{hook}")  # fmt: skip
            shown = json.loads(_tc("-j", "filter", "show", "dev", iface, hook).stdout or "[]")
            ids = [
                f["options"]["prog"]["id"]
                for f in shown
                if f.get("pref") == PRIO and "prog" in f.get("options", {})
            ]
            if not ids:
                raise WireError(f"the BPF filter on {iface} {hook} is not listed by tc")
            prog_ids[hook] = int(ids[0])
    except BaseException:
        detach(iface, created)
        raise
    return created, prog_ids


def detach(iface: str, remove_clsact: bool) -> None:
    """Remove the accounting filters (and the clsact qdisc when this tool created it)."""
    for hook in HOOKS:
        _tc("filter", "del", "dev", iface, hook, "prio", str(PRIO), check=False)
    if remove_clsact:
        _tc("qdisc", "del", "dev", iface, "clsact", check=False)


def iface_counters(iface: str) -> dict[str, int]:
    """The interface's rx/tx bytes, packets and drops from /proc/net/dev (this namespace)."""
    source = "/proc/net/dev"
    try:
        f = interface_fields(Path(source).read_bytes(), iface.encode(), source)
    except KeyError as err:
        raise WireError(str(err)) from None
    return {
        "rx_bytes": f[0],
        "rx_packets": f[1],
        "rx_dropped": f[3],
        "tx_bytes": f[8],
        "tx_packets": f[9],
        # veth drops a frame the peer's backlog has no room for: offered, not sent.
        "tx_dropped": f[11],
    }


# ──────────────────────────────────────────────────────────────────────────── clock


def mono_to_real_ns(tries: int = 20) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC (ns), from the tightest of ``tries`` bracketed reads."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        r0 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if best is None or r1 - r0 < best[0]:
            best = (r1 - r0, (r0 + r1) // 2 - m)
    assert best is not None
    return best[1]


# ──────────────────────────────────────────────────────────────────────────── drain


@dataclass
class Ring:
    """One hook's bins array, memory-mapped (BPF_F_MMAPABLE), and how far it has been drained.

    Draining copies the finished bins of every peer out and zeroes their slots, so the program
    finds them empty when the ring comes round again; a bin more than a lap old when drained
    has been added to by the next lap (``overruns`` counts them)."""

    hook: str
    fd: int
    slots: int
    peers: int  # peer slots incl. 0
    next_bin: int  # first bin not read yet
    view: np.ndarray = field(init=False)  # (peers, slots, 3) uint64 over the map's memory
    rows: list[np.ndarray] = field(default_factory=list)  # (bin, peer, bytes, packets, skbs)
    overruns: int = 0
    _mm: mmap.mmap | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        import numpy as np

        size = self.peers * self.slots * _BIN_FIELDS * 8
        length = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self._mm = mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        flat = np.frombuffer(self._mm, dtype=np.uint64, count=size // 8)
        self.view = flat.reshape(self.peers, self.slots, _BIN_FIELDS)

    def drain(self, upto_bin: int) -> None:
        """Copy out and clear bins ``next_bin .. upto_bin - 1`` of every peer."""
        import numpy as np

        if upto_bin - self.next_bin > self.slots:
            self.overruns += upto_bin - self.slots - self.next_bin
            self.next_bin = upto_bin - self.slots
        lo = self.next_bin
        while lo < upto_bin:
            start = lo % self.slots
            n = min(upto_bin - lo, self.slots - start)  # up to the end of the ring, then wrap
            block = self.view[:, start : start + n, :]
            values = block.copy()
            block[...] = 0
            peer, k = np.nonzero(values[:, :, 1])  # bins with at least one frame
            if len(k):
                out = np.empty((len(k), 5), dtype=np.uint64)
                out[:, 0] = lo + k
                out[:, 1] = peer
                out[:, 2:] = values[peer, k]
                out[:, 4] = out[:, 3] - out[:, 4]  # socket buffers = frames - GSO extra
                self.rows.append(out)
            lo += n
        self.next_bin = upto_bin

    def table(self) -> np.ndarray:
        import numpy as np

        return np.concatenate(self.rows) if self.rows else np.empty((0, 5), dtype=np.uint64)

    def close(self) -> None:
        self.view = None  # type: ignore[assignment]  # release the buffer before unmapping
        if self._mm is not None:
            self._mm.close()


def peer_entries(peers: Sequence[str]) -> list[tuple[bytes, bytes]]:
    """The cs_peers array's entries: key the last byte of each IPv4 address, value the address
    (network order) and its slot (1..). Raises WireError when two peers share a last byte or an
    address is not IPv4."""
    import socket

    entries: dict[int, tuple[bytes, int]] = {}
    for slot, addr in enumerate(peers, start=1):
        try:
            raw = socket.inet_aton(addr)
        except OSError:
            raise WireError(f"peer {addr!r} is not an IPv4 address") from None
        if raw[3] in entries:
            other = socket.inet_ntoa(entries[raw[3]][0])
            raise WireError(f"peers {other} and {addr} share their last byte")
        entries[raw[3]] = (raw, slot)
    return [(struct.pack("=I", k), raw + struct.pack("=I", s)) for k, (raw, s) in entries.items()]


def run(
    iface: str,
    obj: Path,
    bin_ns: int,
    slots: int,
    peers: Sequence[str],
    out: Path,
    meta_out: Path,
    max_seconds: float,
    poll_s: float,
    stop: list[bool],
) -> dict[str, Any]:
    """Attach, drain until ``stop[0]`` or ``max_seconds``, detach, write ``out`` and
    ``meta_out``; returns the metadata."""
    # Import the writer's libraries now, not after SIGTERM (the cell waits for the output,
    # ~0.4 s, benchmarks/cell.py), and before attaching: from the attach on, the ring must be
    # drained at least once a lap, and on two cores busy with the other tools' own imports this
    # import alone once took more than the lap (RING_SECONDS), so the first drain counted
    # thousands of overrun bins.
    import numpy  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    # Before attaching: the first packets counted fall in this bin or a later one. The
    # counters are read on both sides of the attach and of the detach: a packet (an ARP
    # probe) can cross between the attach and the first read, so the totals lie between the
    # counters read while attached and those of the outer bracket, and equal them when quiet.
    counters_before = iface_counters(iface)
    now_bin = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // bin_ns
    created, prog_ids = attach(iface, obj)
    fds: list[int] = []
    rings: list[Ring] = []
    try:
        for hook in HOOKS:
            maps = prog_maps(prog_ids[hook])
            fds += maps.values()
            if "cs_bins" not in maps or "cs_peers" not in maps:
                raise WireError(f"program on {iface} {hook} lacks its maps: {sorted(maps)}")
            for key, value in peer_entries(peers):
                map_update(maps["cs_peers"], key, value)
            rings.append(Ring(hook, maps["cs_bins"], slots, len(peers) + 1, now_bin))
        counters_start = iface_counters(iface)
        offset_start = mono_to_real_ns()
        # The orchestrator starts training once it reads this line.
        print(f"attached to {iface} (prog ids {prog_ids})", file=sys.stderr, flush=True)
        t_start = time.time_ns()
        deadline = time.monotonic() + max_seconds
        while not stop[0] and time.monotonic() < deadline:
            time.sleep(poll_s)
            # Every bin but the newest few is complete (a packet of bin b is counted at b).
            upto = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // bin_ns - _GUARD_BINS + 1
            for ring in rings:
                ring.drain(upto)
        counters_end = iface_counters(iface)
        end_bin = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // bin_ns + 1
        for ring in rings:
            ring.drain(end_bin)
        offset_end = mono_to_real_ns()
    finally:
        for ring in rings:
            ring.close()
        for fd in fds:
            os.close(fd)
        detach(iface, created)
    counters_after = iface_counters(iface)
    meta = {
        "source": "bpf",
        "iface": iface,
        "bin_ns": bin_ns,
        "ring_slots": slots,
        "peers": list(peers),
        "mono_to_real_ns": {"start": offset_start, "end": offset_end},
        "t_start_ns": t_start,
        "t_end_ns": time.time_ns(),
        "counters_start": counters_start,
        "counters_end": counters_end,
        "counters_outer": {"before_attach": counters_before, "after_detach": counters_after},
        "overruns": {r.hook: r.overruns for r in rings},
        "created_clsact": created,
    }
    table, totals = _table(rings, peers, bin_ns, offset_start)
    meta["totals"] = totals
    _write(table, out, meta, meta_out)
    return meta


def _table(
    rings: list[Ring], peers: Sequence[str], bin_ns: int, offset_ns: int
) -> tuple[pa.Table, dict[str, dict[str, int]]]:
    """One row per non-empty (bin, hook, peer), ordered by time, hook and peer: the tidy node
    table (WIRE_BIN_COLUMNS), built without pandas (:mod:`commscope.node.periodic`); and each
    hook's byte and packet totals."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from commscope.node.periodic import arrow_array, columns_table

    names = ["", *peers]
    hooks = sorted(HOOKS)  # a row's hook as its index here: its rank in a sort by name
    parts = [(hooks.index(r.hook), r.table()) for r in rings]
    hook = np.concatenate([np.full(len(t), h, dtype=np.int64) for h, t in parts])
    t = np.concatenate([t for _, t in parts]).astype(np.int64)
    # The order a sort by (t_ns, hook, peer) gives: each peer slot ranked by its name.
    name_rank = np.argsort(np.argsort(np.array(names, dtype=object), kind="stable"))
    order = np.lexsort((name_rank[t[:, 1]], hook, t[:, 0]))
    t, hook = t[order], hook[order]
    schema = pa.schema(
        [("t_ns", pa.int64()), ("hook", pa.string()), ("peer", pa.string())]
        + [(name, pa.int64()) for name in ("bytes", "packets", "skbs")]
    )
    # Names by index, expanded in C (take): a Python string per row is seconds at 10**7 bins.
    columns = [
        t[:, 0] * bin_ns + offset_ns,
        pc.take(arrow_array(hooks, pa.string()), arrow_array(hook, pa.int64())),
        pc.take(arrow_array(names, pa.string()), arrow_array(t[:, 1], pa.int64())),
        t[:, 2],
        t[:, 3],
        t[:, 4],
    ]
    totals = {
        name: {
            k: int(t[hook == hooks.index(name), col].sum())
            for k, col in (("bytes", 2), ("packets", 3))
        }
        for name in HOOKS
    }
    return columns_table(columns, schema), totals


def _write(table: pa.Table, out: Path, meta: dict[str, Any], meta_out: Path) -> None:
    import pyarrow.parquet as pq

    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp_meta = meta_out.with_name(meta_out.name + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=2))
    tmp_meta.rename(meta_out)
    tmp.rename(out)  # last: the orchestrator waits for this name


def check(iface: str, obj: Path) -> str | None:
    """None if the accounting can attach on ``iface`` here, else why not."""
    if os.geteuid() != 0:
        return "not root (tc BPF filters and bpf() need root: run as root or via sudo)"
    if shutil.which("tc") is None:
        return "tc not found (install iproute2)"
    try:
        created, prog_ids = attach(iface, obj)
        try:
            for fd in prog_maps(prog_ids["ingress"]).values():
                os.close(fd)
        finally:
            detach(iface, created)
    except (WireError, OSError) as err:
        return str(err)
    return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_check = sub.add_parser("check", help="can the accounting attach here? (exit 1: no, why)")
    p_run = sub.add_parser("run", help="account until SIGTERM/SIGINT or --max-seconds")
    for p in (p_check, p_run):
        p.add_argument("--iface", required=True)
        p.add_argument("--obj", type=Path, required=True)
    p_run.add_argument("--bin-ns", type=int, required=True)
    p_run.add_argument("--slots", type=int, required=True)
    p_run.add_argument("--peers", default="", help="comma-separated IPv4 addresses")
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("--meta", type=Path, required=True)
    p_run.add_argument("--max-seconds", type=float, default=3600.0)
    p_run.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S)
    p_run.add_argument("--tag", default="", help="marks the command line (to find/kill it)")
    args = parser.parse_args(argv)
    if args.cmd == "check":
        why = check(args.iface, args.obj)
        print(why or "ok")
        sys.exit(1 if why else 0)
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    peers = [p for p in args.peers.split(",") if p]
    run(args.iface, args.obj, args.bin_ns, args.slots, peers, args.out, args.meta,
        args.max_seconds, args.poll_s, stop)  # fmt: skip


if __name__ == "__main__":
    main()
