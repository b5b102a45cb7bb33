"""Framework-level capture of every c10d operation a rank issues.

How: Python kernels registered with ``torch.library`` on the *Autograd* dispatch keys of the
c10d and functional-collective operators. Every path into a process group goes through those
operators — Python ``torch.distributed`` calls, the C++ DDP reducer (``ProcessGroup::allreduce``
dispatches ``c10d::allreduce_``), DTensor/FSDP functional collectives and pipelining P2P — so all
of them land here, on whichever thread issues them. Unlike a ``TorchDispatchMode`` this costs
nothing for compute ops: only communication ops enter Python. Our kernel records the op, then
re-dispatches below autograd to the real backend kernel.

Completion time: c10d ops return a ``Work`` whose future we attach a callback to; functional
collectives complete at their ``wait_tensor``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# Canonical op names for the report; keys are operator names without the overload.
C10D_OPS: dict[str, str] = {
    "allreduce_": "allreduce",
    "allreduce_coalesced_": "allreduce",
    "broadcast_": "broadcast",
    "allgather_": "allgather",
    "_allgather_base_": "allgather",
    "allgather_coalesced_": "allgather",
    "allgather_into_tensor_coalesced_": "allgather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "alltoall",
    "alltoall_base_": "alltoall",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
    "gather_": "gather",
    "scatter_": "scatter",
    "reduce_": "reduce",
}
FUNCTIONAL_OPS: dict[str, str] = {
    "all_reduce": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather_into_tensor": "allgather",
    "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "alltoall",
    "broadcast": "broadcast",
}
# Argument names that hold what a rank contributes (in) and what it receives (out).
_IN_ARGS = ("tensors", "input_tensors", "input_tensor", "input", "inputs", "tensor")
_OUT_ARGS = ("output_tensors", "output_tensor", "output", "outputs")
_AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA")
_ROOTED = ("broadcast", "reduce", "gather", "scatter")


@dataclass
class OpRecord:
    """One communication op as issued by this rank (see docs/traces.md for units)."""

    op: str
    source: str
    group: str
    group_ranks: str
    group_size: int
    peer: int
    root: int
    dtype: str
    numel: int
    bytes: int
    bytes_out: int
    seq: int
    step: int
    phase: str
    t_issue_ns: int
    t_end_ns: int | None = None


@dataclass
class _State:
    enabled: bool = False
    step: int = -1
    phase: str = "other"
    records: list[OpRecord] = field(default_factory=list)
    seq: dict[tuple, int] = field(default_factory=lambda: defaultdict(int))
    pending: dict[int, tuple[weakref.ref, OpRecord]] = field(default_factory=dict)
    groups: dict[str, tuple[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()
_LIBS: list[torch.library.Library] = []


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _group_info(pg: dist.ProcessGroup) -> tuple[str, str, int]:
    name = pg.group_name
    cached = _STATE.groups.get(name)
    if cached is None:
        ranks = dist.get_process_group_ranks(pg)
        cached = (",".join(map(str, ranks)), len(ranks))
        _STATE.groups[name] = cached
    return name, cached[0], cached[1]


def _record(op: str, source: str, schema_args: dict[str, Any], pg: dist.ProcessGroup) -> OpRecord:
    group, ranks, size = _group_info(pg)
    ins = [t for a in _IN_ARGS if a in schema_args for t in _flatten(schema_args[a])]
    outs = [t for a in _OUT_ARGS if a in schema_args for t in _flatten(schema_args[a])]
    peer = root = -1
    # c10d ops carry group-local ranks; the table stores global ranks.
    if op in ("send", "recv"):
        for key in ("dst", "src"):
            if isinstance(schema_args.get(key), int) and schema_args[key] >= 0:
                peer = dist.get_global_rank(pg, schema_args[key])
    elif op in _ROOTED:
        for key in ("root_rank", "root", "src"):
            if isinstance(schema_args.get(key), int) and schema_args[key] >= 0:
                root = dist.get_global_rank(pg, schema_args[key])
                break
    if op in ("recv",):
        outs, ins = ins, []
    ref = (ins or outs)[0] if (ins or outs) else None
    with _STATE.lock:
        key = (group, op, peer) if peer >= 0 else (group,)
        seq = _STATE.seq[key]
        _STATE.seq[key] = seq + 1
        rec = OpRecord(
            op=op,
            source=source,
            group=group,
            group_ranks=ranks,
            group_size=size,
            peer=peer,
            root=root,
            dtype=str(ref.dtype).removeprefix("torch.") if ref is not None else "",
            numel=sum(t.numel() for t in ins) if ins else sum(t.numel() for t in outs),
            bytes=_nbytes(ins) if ins else _nbytes(outs),
            bytes_out=_nbytes(outs) if outs else _nbytes(ins),
            seq=seq,
            step=_STATE.step,
            phase=_STATE.phase,
            t_issue_ns=time.time_ns(),
        )
        _STATE.records.append(rec)
    return rec


def _complete(rec: OpRecord) -> None:
    rec.t_end_ns = time.time_ns()


class _Poller:
    """Completion for Work objects without a future (gloo send/recv, reduce_scatter).

    A daemon thread checks ``is_completed()`` every ``interval_s`` while such works are pending
    and sleeps on a condition otherwise, so it costs nothing when idle.
    """

    def __init__(self, interval_s: float = 200e-6, give_up_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.give_up_ns = int(give_up_s * 1e9)
        self.pending: list[tuple[dist.Work, OpRecord]] = []
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def add(self, work: dist.Work, rec: OpRecord) -> None:
        with self.cond:
            self.pending.append((work, rec))
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name="commscope-poll", daemon=True
                )
                self.thread.start()
            self.cond.notify()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                still = []
                now = time.time_ns()
                for work, rec in self.pending:
                    if work.is_completed():
                        _complete(rec)
                    elif now - rec.t_issue_ns < self.give_up_ns:
                        still.append((work, rec))
                    # else: this Work never reports completion (gloo's reduce-scatter keeps
                    # is_completed() False even after wait()): leave t_end_ns null, stop polling.
                self.pending = still
            time.sleep(self.interval_s)

    def drop_all(self) -> None:
        """Forget every pending Work (their records keep a null end time)."""
        with self.cond:
            self.pending = []


_POLLER = _Poller()


def _watch(work: dist.Work, rec: OpRecord) -> None:
    try:
        fut = work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented" for some gloo works
        _POLLER.add(work, rec)
        return
    fut.add_done_callback(lambda _f, r=rec: _complete(r))


def _make_c10d_kernel(overload: Any, op: str):  # noqa: ANN202 - a torch.library kernel
    names = [a.name for a in overload._schema.arguments]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        rec = None
        if _STATE.enabled:
            bound = dict(zip(names, args, strict=False)) | kwargs
            pg = dist.ProcessGroup.unbox(bound["process_group"])
            rec = _record(op, "c10d", bound, pg)
        with torch._C._AutoDispatchBelowAutograd():
            out = overload(*args, **kwargs)
        if rec is not None:
            work = out[-1] if isinstance(out, tuple) else out
            if isinstance(work, torch.ScriptObject):
                _watch(dist.Work.unbox(work), rec)
            else:
                _complete(rec)
        return out

    return kernel


def _make_functional_kernel(overload: Any, op: str):  # noqa: ANN202
    names = [a.name for a in overload._schema.arguments]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        rec = None
        if _STATE.enabled:
            bound = dict(zip(names, args, strict=False)) | kwargs
            pg = dist.distributed_c10d._resolve_process_group(bound["group_name"])
            rec = _record(op, "functional", bound, pg)
        with torch._C._AutoDispatchBelowAutograd():
            out = overload(*args, **kwargs)
        if rec is not None:
            # Completion is observed at wait_tensor on the returned tensor(s).
            for t in _flatten(out):
                _STATE.pending[id(t)] = (weakref.ref(t), rec)
        return out

    return kernel


def _wait_kernel(overload: Any):  # noqa: ANN202
    def kernel(tensor: torch.Tensor) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            out = overload(tensor)
        entry = _STATE.pending.pop(id(tensor), None)
        if entry is not None and entry[0]() is tensor and entry[1].t_end_ns is None:
            _complete(entry[1])
        return out

    return kernel


def install() -> None:
    """Register the recording kernels (once per process). Recording starts with enable()."""
    if _LIBS:
        return
    for namespace, table, factory in (
        ("c10d", C10D_OPS, _make_c10d_kernel),
        ("_c10d_functional", FUNCTIONAL_OPS, _make_functional_kernel),
    ):
        lib = torch.library.Library(namespace, "IMPL")
        _LIBS.append(lib)
        ns_ops = getattr(torch.ops, namespace)
        for name, canonical in table.items():
            if not hasattr(ns_ops, name):
                continue  # operator absent in this torch build
            overload = getattr(ns_ops, name).default
            for key in _AUTOGRAD_KEYS:
                lib.impl(name, factory(overload, canonical), key)
        if namespace == "_c10d_functional":
            wait = ns_ops.wait_tensor.default
            for key in _AUTOGRAD_KEYS:
                lib.impl("wait_tensor", _wait_kernel(wait), key)


def enable(on: bool = True) -> None:
    _STATE.enabled = on


def set_step(step: int) -> None:
    _STATE.step = step


def set_phase(phase: str) -> None:
    _STATE.phase = phase


def records() -> list[OpRecord]:
    """Everything recorded so far in this process (issue order)."""
    return list(_STATE.records)


def finish() -> None:
    """Stop recording and release every Work and tensor the capture still holds.

    Call before ``destroy_process_group``: a gloo Work that outlives its process group is
    destroyed during interpreter teardown and aborts the process (SIGABRT after the traces were
    written) — gloo's reduce-scatter Works never report completion, so the poller would
    otherwise still hold them when a short run ends.
    """
    enable(False)
    _POLLER.drop_all()
    _STATE.pending.clear()


def reset() -> None:
    with _STATE.lock:
        _STATE.records.clear()
        _STATE.seq.clear()
        _STATE.pending.clear()
