"""Framework-level capture of every c10d operation a rank issues.

How: Python kernels registered with ``torch.library`` on the *Autograd* dispatch keys of the
c10d and functional-collective operators. Every path into a process group goes through those
operators — Python ``torch.distributed`` calls, the C++ DDP reducer (``ProcessGroup::allreduce``
dispatches ``c10d::allreduce_``), DTensor/FSDP functional collectives and pipelining P2P — so all
of them land here, on whichever thread issues them. Unlike a ``TorchDispatchMode`` this costs
nothing for compute ops: only communication ops enter Python. Our kernel records the op, then
re-dispatches below autograd to the real backend kernel.

Completion time (``t_end_ns``), from the backend's own signal wherever there is one:

* c10d ops: a done-callback on the ``Work``'s future.
* Functional collectives (DTensor, FSDP): their C++ kernel issues the matching c10d op through
  the dispatcher with the autograd keys excluded, so it reaches a second kernel of ours on the
  ``ADInplaceOrView`` key, which hooks that inner ``Work``'s future to the functional op's row.
  The wait on the result (below) remains the fallback for a backend whose functional kernel
  hides its Work.
* Works without a future (gloo reduce-scatter, send, recv): gloo's reduce-scatter Work never
  reports ``is_completed()`` but its ``wait()`` may be called from any thread, so a waiter thread
  blocks on it; send/recv Works must be waited exactly once (a second ``wait()`` blocks forever),
  so a poller checks their ``is_completed()``, which turns true once the issuer has waited.

Wait (``t_wait_start_ns``, ``t_wait_end_ns``, ``wait_ns``; frame()'s :data:`WAIT_COLUMNS`): how
long the training thread (the one that called :func:`enable`) was blocked on the op, from its
first wait there (a second wait on the same op is not stamped):

* A ``Work`` handed to Python: ``Work.wait`` is wrapped (the class attribute), so every Python
  wait — ``work.wait()`` in user code, pipelining, FSDP2, and the synchronous ``torch.distributed``
  calls, which wait inside ``distributed_c10d`` — is stamped. Works are tied to their rows by
  identity (a weak-keyed map; a short ring keeps the Python object alive until the caller holds
  it). A synchronous call's wait starts at the op's issue: the thread entered the blocking call.
* Functional collectives: the Python ``wait_tensor`` (``AsyncCollectiveTensor``'s wait, which runs
  inside ``__torch_dispatch__``, below the autograd keys) is wrapped, and the ``wait_tensor``
  kernel covers calls through the dispatcher. The waited tensor is found by its storage: DTensor
  waits on a view of the op's output, not on the output itself.
* The DDP reducer's bucket all-reduces, issued by C++ autograd hooks and waited on in C++ by its
  final callback (``finalize_backward``): a final callback of ours, queued ahead of the reducer's,
  stamps when the backward's compute ended and queues one behind it; a bucket's wait is from the
  first stamp to its completion (clipped to the second), zero for a bucket done before.
* Ops a C++ call waits on before returning to Python (DDP's ``_broadcast_coalesced`` of buffers,
  its bucket-layout broadcast) and ops that return no ``Work``: blocking, the wait is
  [issue, completion].
* CUDA tensors: a wait only orders streams, so the thread's blocking says nothing; null (unknown).

Per-op cost: rows are tuples appended to one list (no object per op), argument positions are
resolved once per operator, group and dtype names are cached, and the completion callback only
writes one list slot. See docs/overhead.md.
"""

from __future__ import annotations

import collections
import functools
import queue
import sys
import threading
import time
import weakref
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from commscope.contracts import OPS_COLUMNS, P2P_OPS, ROOTED_OPS, WAIT_COLUMNS
from commscope.workload import capture_native

if TYPE_CHECKING:
    import pandas as pd

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
_PEER_ARGS = ("dst", "src")
_ROOT_ARGS = ("root_rank", "root", "src")
_AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA")


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
    # All-to-all with uneven splits: bytes this rank sends to each member, in group order
    # ("b0,b1,..."); None for every other op and for even all-to-alls.
    split_bytes: str | None
    seq: int
    step: int
    phase: str
    t_issue_ns: int
    t_end_ns: int | None = None


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(OpRecord))
# OpRecord is the contract's ops row (contracts.OPS_COLUMNS) without rank, node and local_rank,
# which the rank adds when it writes the table (workload.entry.write_rank_tables).
if OPS_COLUMNS[3:] != COLUMNS:
    raise AssertionError(f"OpRecord's fields {COLUMNS} are not contracts.OPS_COLUMNS[3:]")
# frame() adds contracts.WAIT_COLUMNS after them: the training thread's wait on the op (module
# docstring), its start and end, null when it never blocked on the op (wait_ns 0) or when that
# cannot be told (wait_ns null: CUDA). Not OpRecord fields: the importers' tables, which have no
# waits, keep OpRecord's columns.
# Markers in _Table.w_start for rows whose wait is not stamped by a wait call: the whole op is
# the wait (a blocking call) / the wait cannot be observed (CUDA).
_BLOCKING = -2
_UNKNOWN = -1


class _Table:
    """Recorded ops, columnar enough to be cheap: one tuple per op (every field up to the issue
    time) and parallel lists that completion callbacks and waits fill in by index: end times,
    wait starts (None: not waited on while incomplete, or a marker) and wait ends."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.t_end: list[int | None] = []
        self.w_start: list[int | None] = []
        self.w_end: list[int | None] = []
        # Rows whose end the native kernel stamps: row -> its slot (capture_native.ends).
        self.slots: dict[int, int] = {}


class _State:
    def __init__(self) -> None:
        self.enabled = False
        self.step = -1
        self.phase = "other"
        self.table = _Table()
        self.seq: dict[Any, int] = {}
        self.groups: dict[Any, tuple[str, str, int, Any]] = {}
        # Functional rows by their output's storage (the waited tensor may be a view of the
        # output, as in DTensor): data pointer -> (row, table, whether the wait also stamps the
        # end: no inner Work was seen). Popped by the first wait; a later output at the same
        # address replaces an entry never waited on (the old storage was freed).
        self.pending: dict[int, tuple[int, _Table, bool]] = {}
        self.lock = threading.Lock()
        # The training thread (the one that called enable(True)): only its waits are stamped.
        self.thread: int | None = None
        # Rows issued by C++ autograd hooks (the DDP reducer) in the running backward, whose
        # wait is the reducer's final callback; and the graph task our callback is queued for.
        self.backward_rows: list[tuple[_Table, int]] = []
        self.callback_task = -1


_STATE = _State()
_LIBS: list[torch.library.Library] = []
# The native kernel (capture_native) while installed, else None: the Python kernels run.
_NATIVE: Any = None
# Its end stamps' reader, kept after uninstall(): a table's slots outlive the kernel.
_NATIVE_ENDS: Any = None
# The functional row whose C++ kernel is running on this thread: [row, table, work seen].
_TLS = threading.local()
_DTYPES: dict[torch.dtype, str] = {}
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_BELOW_INPLACE_OR_VIEW = torch._C._AutoDispatchBelowADInplaceOrView
# Around every re-dispatch from our kernels. Calling an operator from Python scans each argument
# for ``__torch_function__``; on a ScriptObject (the ProcessGroup and ReduceOp of every c10d op)
# that getattr misses through a C++ exception, ~80 us per op on this machine, half the capture's
# cost. The call is already inside the dispatcher (its Python entry handled torch functions and
# modes; C++-issued ops never had any), so switching them off here changes nothing.
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_GRAPH_TASK_ID = torch._C._current_graph_task_id  # -1 outside a backward on this thread
_ENGINE = torch.autograd.Variable._execution_engine  # queues the backward's final callbacks
# Python Works -> (table, row). Weak keys: a Work the caller dropped leaves the map by itself.
_WORK_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The last Works seen, kept alive until their Python caller holds them: pybind hands the caller
# the same object only while one exists (and the map is keyed by that object). The caller gets
# its Work as soon as our kernel returns, so a few suffice; more would keep the tensors of
# finished ops (FSDP's gathered parameters) alive longer.
_KEEP: collections.deque = collections.deque(maxlen=4)
# Calls from here return a Work to Python code that may wait on it (and waits itself when the
# call is synchronous); a c10d op reached from any other Python frame is issued by C++.
_C10D_FILE = dist.distributed_c10d.__file__
_WORK_WAIT = dist.Work.wait  # the original, restored by uninstall()
_FC_WAIT: Any = None  # the original _functional_collectives.wait_tensor, once wrapped


def _set_end(t_end: list[int | None], row: int, _fut: object = None) -> None:
    t_end[row] = time.time_ns()


class _ArgSpec:
    """Where an operator keeps its inputs, outputs, group, peer and root: resolved once from
    its schema, so the per-op path indexes ``args`` instead of building a dict."""

    def __init__(self, overload: Any, op: str) -> None:
        names = [a.name for a in overload._schema.arguments]
        self.names = names
        self.ins = [(names.index(a), a) for a in _IN_ARGS if a in names]
        self.outs = [(names.index(a), a) for a in _OUT_ARGS if a in names]
        self.peer = [(names.index(a), a) for a in _PEER_ARGS if a in names] if op in P2P_OPS else []
        self.root = (
            [(names.index(a), a) for a in _ROOT_ARGS if a in names] if op in ROOTED_OPS else []
        )
        # Uneven all-to-all: the per-destination row counts of the input (c10d and functional).
        self.splits = names.index("input_split_sizes") if "input_split_sizes" in names else -1
        self.group = "process_group" if "process_group" in names else "group_name"
        self.group_pos = names.index(self.group)
        if op == "recv":  # a receive's tensors are what it gets, not what it sends
            self.ins, self.outs = [], self.ins

    @staticmethod
    def get(args: tuple, kwargs: dict, pos: int, name: str) -> Any:
        return args[pos] if pos < len(args) else kwargs.get(name)


def _sizes(values: list[Any]) -> tuple[int, int, torch.Tensor | None]:
    """(element count, bytes, first tensor) over tensors, lists and lists of lists."""
    numel = nbytes = 0
    first = None
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            n = v.numel()
            numel += n
            nbytes += n * v.element_size()
            first = v  # popped last-to-first: ends on the first tensor
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return numel, nbytes, first


def _group_info(spec: _ArgSpec, args: tuple, kwargs: dict) -> tuple[str, str, int, Any]:
    """(name, "r0,r1,...", size, ProcessGroup) of the op's group, cached per group object
    (unboxing returns the registered Python object) and per functional group name. Names are
    reused after ``destroy_process_group``, so finish() and reset() empty the cache."""
    key = spec.get(args, kwargs, spec.group_pos, spec.group)
    if spec.group == "process_group":
        key = dist.ProcessGroup.unbox(key)
    cached = _STATE.groups.get(key)
    if cached is None:
        pg = key
        if spec.group == "group_name":
            pg = dist.distributed_c10d._resolve_process_group(key)
        ranks = dist.get_process_group_ranks(pg)
        cached = (pg.group_name, ",".join(map(str, ranks)), len(ranks), pg)
        _STATE.groups[key] = cached
    return cached


def _record(op: str, source: str, spec: _ArgSpec, args: tuple, kwargs: dict) -> tuple[int, _Table]:
    """Append one row for this op; returns its index and the table it went to."""
    group, ranks, size, pg = _group_info(spec, args, kwargs)
    get = spec.get
    n_in, b_in, t_in = _sizes([get(args, kwargs, p, a) for p, a in spec.ins])
    n_out, b_out, t_out = _sizes([get(args, kwargs, p, a) for p, a in spec.outs])
    peer = root = -1
    # c10d ops carry group-local ranks; the table stores global ranks.
    for p, a in spec.peer:
        v = get(args, kwargs, p, a)
        if isinstance(v, int) and v >= 0:
            peer = dist.get_global_rank(pg, v)
    for p, a in spec.root:
        v = get(args, kwargs, p, a)
        if isinstance(v, int) and v >= 0:
            root = dist.get_global_rank(pg, v)
            break
    ref = t_in if t_in is not None else t_out
    dtype = ""
    if ref is not None:
        dtype = _DTYPES.get(ref.dtype) or _DTYPES.setdefault(
            ref.dtype, str(ref.dtype).removeprefix("torch.")
        )
    has_in = t_in is not None
    has_out = t_out is not None
    splits = None
    if spec.splits >= 0 and has_in and t_in.dim() > 0 and t_in.shape[0] > 0:
        rows = get(args, kwargs, spec.splits, "input_split_sizes")
        if rows:  # empty: an even split, which the traffic model assumes anyway
            row_bytes = b_in // t_in.shape[0]
            splits = ",".join(str(int(r) * row_bytes) for r in rows)
    key = (group, op, peer) if peer >= 0 else group
    table = _STATE.table
    with _STATE.lock:
        seq = _STATE.seq.get(key, 0)
        _STATE.seq[key] = seq + 1
        row = len(table.rows)
        table.rows.append(
            (
                op,
                source,
                group,
                ranks,
                size,
                peer,
                root,
                dtype,
                n_in if has_in else n_out,
                b_in if has_in else b_out,
                b_out if has_out else b_in,
                splits,
                seq,
                _STATE.step,
                _STATE.phase,
                time.time_ns(),
            )
        )
        table.t_end.append(None)
        # A CUDA op's wait only orders streams: the thread's blocking says nothing about it.
        table.w_start.append(_UNKNOWN if ref is not None and ref.is_cuda else None)
        table.w_end.append(None)
    return row, table


class _Poller:
    """Completion of send/recv Works, which have no future and must not be waited on twice.

    A daemon thread checks ``is_completed()`` every ``interval_s`` while such works are pending
    and sleeps on a condition otherwise, so it costs nothing when idle.
    """

    def __init__(self, interval_s: float = 200e-6, give_up_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.give_up_ns = int(give_up_s * 1e9)
        self.pending: list[tuple[dist.Work, list, int, int]] = []
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def add(self, work: dist.Work, t_end: list, row: int) -> None:
        with self.cond:
            self.pending.append((work, t_end, row, time.time_ns()))
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
                for item in self.pending:
                    work, t_end, row, t0 = item
                    if work.is_completed():
                        if t_end[row] is None:  # the issuer's wait may have stamped it first
                            t_end[row] = now
                    elif now - t0 < self.give_up_ns:
                        still.append(item)
                    # else: never waited on by its issuer: leave t_end_ns null, stop polling.
                self.pending = still
            time.sleep(self.interval_s)

    def drop_all(self) -> None:
        """Forget every pending Work (their records keep a null end time)."""
        with self.cond:
            self.pending = []


class _Waiter:
    """Completion of Works that have no future but may be waited on from any thread (gloo's
    reduce-scatter, whose ``is_completed()`` never turns true): one daemon thread ``wait()``s
    on them in issue order. Collectives of one group complete in issue order, so a FIFO adds
    no delay; across groups an end time may be late by the earlier work's remaining time."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def add(self, work: dist.Work, t_end: list, row: int) -> None:
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(
                        target=self._loop, name="commscope-wait", daemon=True
                    )
                    self.thread.start()
        self.queue.put((work, t_end, row))

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            work, t_end, row = item
            try:
                _WORK_WAIT(work)  # the original: this thread's waits are no one's wait time
                t_end[row] = time.time_ns()
            except Exception:  # noqa: BLE001 - a failed op keeps a null end; its issuer raises
                pass
            del work, item  # hold no Work while idle (see finish())

    def drain(self, timeout_s: float = 10.0) -> None:
        """Let every queued wait finish, then stop the thread (a fresh one starts on demand)."""
        with self.lock:
            thread, self.thread = self.thread, None
        if thread is not None:
            self.queue.put(None)
            thread.join(timeout_s)


_POLLER = _Poller()
_WAITER = _Waiter()


def _watch(out: Any, op: str, table: _Table, row: int, to_python: bool) -> bool:
    """Arrange for the row's end time to be set when the op in ``out`` completes, and, when
    ``to_python``, for a Python wait on its Work to be stamped; False if ``out`` holds no Work
    (then the op completed inside the call)."""
    work = out[-1] if isinstance(out, tuple) else out
    if not isinstance(work, torch.ScriptObject):
        return False
    work = dist.Work.unbox(work)
    t_end = table.t_end
    if to_python and table.w_start[row] is None:  # not for CUDA ops: their waits are unknown
        _KEEP.append(work)
        _WORK_ROWS[work] = (table, row)
    try:
        fut = work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented" (gloo send/recv, reduce-scatter)
        (_POLLER if op in P2P_OPS else _WAITER).add(work, t_end, row)
        return True
    fut.add_done_callback(functools.partial(_set_end, t_end, row))
    return True


def _work_wait(self: dist.Work, *args: Any, **kwargs: Any) -> Any:
    """``Work.wait`` that stamps the training thread's first wait on a recorded op."""
    entry = _WORK_ROWS.get(self)
    if entry is None or threading.get_ident() != _STATE.thread:
        return _WORK_WAIT(self, *args, **kwargs)
    table, row = entry
    if table.w_start[row] is not None:  # waited on before (or not observable): not stamped
        return _WORK_WAIT(self, *args, **kwargs)
    # torch.distributed's synchronous calls wait on their own Work: the thread has been in the
    # blocking call since the op's issue (but not in _CoalescingManager.wait, the caller's wait).
    code = sys._getframe(1).f_code
    sync = code.co_filename == _C10D_FILE and code.co_name != "wait"
    table.w_start[row] = table.rows[row][-1] if sync else time.time_ns()
    try:
        return _WORK_WAIT(self, *args, **kwargs)
    finally:
        now = time.time_ns()
        table.w_end[row] = now
        # gloo send/recv complete only inside wait(): its return is the completion (the poller
        # would see it up to its period later).
        if table.t_end[row] is None and table.rows[row][0] in P2P_OPS:
            table.t_end[row] = now


def _claim(tensor: torch.Tensor) -> tuple[_Table, int, bool] | None:
    """The functional row whose output (or a view of it) ``tensor`` is, if this is the training
    thread's first wait on it: (table, row, whether the wait's end is also the op's end)."""
    if not _STATE.pending:
        return None
    entry = _STATE.pending.pop(tensor.untyped_storage().data_ptr(), None)
    if entry is None:
        return None
    row, table, sets_end = entry
    if threading.get_ident() != _STATE.thread or table.w_start[row] is not None:
        if sets_end and table.t_end[row] is None:
            table.t_end[row] = time.time_ns()
        return None
    return table, row, sets_end


def _timed_wait(claimed: tuple[_Table, int, bool], wait: Any, tensor: torch.Tensor) -> Any:
    table, row, sets_end = claimed
    table.w_start[row] = time.time_ns()
    try:
        return wait(tensor)
    finally:
        now = time.time_ns()
        table.w_end[row] = now
        if sets_end and table.t_end[row] is None:
            table.t_end[row] = now


def _wait_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``_functional_collectives.wait_tensor``, stamping the wait (AsyncCollectiveTensor's
    wait runs below the autograd keys, where the kernel below never sees it)."""
    claimed = _claim(tensor)
    if claimed is None:
        return _FC_WAIT(tensor)
    return _timed_wait(claimed, _FC_WAIT, tensor)


def _backward_end(t_compute_end: int) -> None:
    """Final callback queued behind the DDP reducer's: its buckets were waited on from
    ``t_compute_end`` (the backward's compute ended) until each completed."""
    now = time.time_ns()
    rows, _STATE.backward_rows = _STATE.backward_rows, []
    _STATE.callback_task = -1
    for table, row in rows:
        if table.w_start[row] is not None:
            continue
        end = table.t_end[row]
        # The reducer returned only once every bucket completed: an end stamped later (the
        # callback waiting for the GIL) or not yet is this moment.
        end = now if end is None or end > now else end
        if end > t_compute_end:
            table.w_start[row] = t_compute_end
            table.w_end[row] = end


def _backward_compute_end() -> None:
    """Final callback queued at the backward's first C++-issued op: it runs once the graph's
    compute is done, ahead of the reducer's finalize (queued at its last bucket)."""
    _ENGINE.queue_callback(functools.partial(_backward_end, time.time_ns()))


def _issued_by(table: _Table, row: int) -> bool:
    """Classify the op just recorded by who waits on it; True when its Work goes to Python.

    From ``distributed_c10d``: the caller gets the Work (and its waits are stamped). From a C++
    autograd hook in a backward on this thread (the DDP reducer): waited on in the reducer's
    final callback. From any other C++ call: it waits before returning (DDP's broadcasts).
    """
    if sys._getframe(2).f_code.co_filename == _C10D_FILE:
        return True
    if table.w_start[row] is not None:  # CUDA: unknown either way
        return False
    task = _GRAPH_TASK_ID()
    if task == -1 or threading.get_ident() != _STATE.thread:
        table.w_start[row] = _BLOCKING
        return False
    try:
        if _STATE.callback_task != task:
            _ENGINE.queue_callback(_backward_compute_end)
            _STATE.callback_task = task
    except RuntimeError:  # no backward to queue on after all: the wait cannot be observed
        table.w_start[row] = _UNKNOWN
        return False
    _STATE.backward_rows.append((table, row))
    return False


def _make_c10d_kernel(overload: Any, op: str):  # noqa: ANN202 - a torch.library kernel
    spec = _ArgSpec(overload, op)
    # The operator itself, not OpOverload.__call__, whose check for fake script objects (export
    # and compile tracing, which never reach a recording run) costs a few us per op.
    call = overload._op

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if not _STATE.enabled:
            with _BELOW_AUTOGRAD(), _BELOW_INPLACE_OR_VIEW(), _NO_TORCH_FUNCTION():
                return call(*args, **kwargs)
        row, table = _record(op, "c10d", spec, args, kwargs)
        to_python = _issued_by(table, row)
        # Below ADInplaceOrView too: the inner kernel there is only for nested calls.
        with _BELOW_AUTOGRAD(), _BELOW_INPLACE_OR_VIEW(), _NO_TORCH_FUNCTION():
            out = call(*args, **kwargs)
        if not _watch(out, op, table, row, to_python):
            _completed_inside(table, row)
        return out

    return kernel


def _completed_inside(table: _Table, row: int) -> None:
    """The op returned no Work: it completed inside the call, which blocked throughout."""
    table.t_end[row] = time.time_ns()
    if table.w_start[row] is None:
        table.w_start[row] = _BLOCKING


def _make_nested_c10d_kernel(overload: Any, op: str):  # noqa: ANN202
    """Kernel on ADInplaceOrView: reached only by c10d ops issued with the autograd keys
    excluded — the inner op of a functional collective (tie its Work to that row), or a c10d
    call from below autograd that the Autograd kernel never saw (record it)."""
    spec = _ArgSpec(overload, op)
    call = overload._op

    def kernel(*args: Any, **kwargs: Any) -> Any:
        parent = getattr(_TLS, "parent", None)
        if parent is None and not _STATE.enabled:
            with _BELOW_INPLACE_OR_VIEW(), _NO_TORCH_FUNCTION():
                return call(*args, **kwargs)
        to_python = False
        if parent is None:
            row, table = _record(op, "c10d", spec, args, kwargs)
            to_python = _issued_by(table, row)
        else:
            row, table = parent[0], parent[1]
        with _BELOW_INPLACE_OR_VIEW(), _NO_TORCH_FUNCTION():
            out = call(*args, **kwargs)
        if not _watch(out, op, table, row, to_python):
            _completed_inside(table, row)
        if parent is not None:
            parent[2] = True
        return out

    return kernel


def _make_functional_kernel(overload: Any, op: str):  # noqa: ANN202
    spec = _ArgSpec(overload, op)
    call = overload._op

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if not _STATE.enabled:  # also skip the inner c10d op's Python kernel
            with _BELOW_AUTOGRAD(), _BELOW_INPLACE_OR_VIEW(), _NO_TORCH_FUNCTION():
                return call(*args, **kwargs)
        row, table = _record(op, "functional", spec, args, kwargs)
        if _NATIVE is not None:
            out, sets_end = _call_native(call, args, kwargs, table, row)
        else:
            parent = [row, table, False]
            _TLS.parent = parent
            try:
                with _BELOW_AUTOGRAD(), _NO_TORCH_FUNCTION():
                    out = call(*args, **kwargs)
            finally:
                _TLS.parent = None
            # The wait on an output is the row's wait, and its end the op's end when no inner
            # Work was seen (a backend whose functional kernel hides it).
            sets_end = not parent[2]
        pending = _STATE.pending
        if len(pending) > _PENDING_MAX:  # outputs never waited on (dropped by their caller)
            for key in list(pending)[: _PENDING_MAX // 2]:  # the oldest half
                pending.pop(key, None)
        for t in out if isinstance(out, (list, tuple)) else [out]:
            ptr = t.untyped_storage().data_ptr()
            if ptr:  # 0: an empty output, nothing to wait for
                pending[ptr] = (row, table, sets_end)
        return out

    return kernel


_PENDING_MAX = 4096


def _call_native(call: Any, args: tuple, kwargs: dict, table: _Table, row: int) -> tuple:
    """Run a functional op's C++ kernel with the native kernel tying its inner c10d op's
    Work to ``row``; returns (the op's output, whether the wait on it also stamps its end: no
    inner Work was seen)."""
    slot = _NATIVE.begin()
    try:
        with _BELOW_AUTOGRAD(), _NO_TORCH_FUNCTION():
            out = call(*args, **kwargs)
    finally:
        seen = _NATIVE.end()
    if seen.__class__ is int:
        if seen == _HOOKED:
            table.slots[row] = slot
        elif seen == _COMPLETED_INSIDE:
            _completed_inside(table, row)
        return out, seen == _NOT_REACHED
    # A Work without a future (gloo reduce-scatter): a thread waits on it, as in _watch.
    _WAITER.add(dist.Work.unbox(seen), table.t_end, row)
    return out, False


# capture_native's end(): what the inner c10d op did.
_NOT_REACHED, _HOOKED, _COMPLETED_INSIDE = 0, 1, 2


def _wait_kernel(overload: Any):  # noqa: ANN202
    def kernel(tensor: torch.Tensor) -> torch.Tensor:
        claimed = _claim(tensor)
        with _BELOW_AUTOGRAD():
            if claimed is None:
                return overload(tensor)
            return _timed_wait(claimed, overload, tensor)

    return kernel


def install() -> None:
    """Register the recording kernels and wrap the Python waits (once per process). Recording
    starts with enable(). The kernel under functional collectives is the native one when it is
    built (:mod:`capture_native`), else Python's: :func:`impl` says which."""
    global _FC_WAIT, _NATIVE, _NATIVE_ENDS
    if _LIBS:
        return
    native = capture_native.load()
    nested: dict[str, Any] = {}  # the native kernel's Python fallback, per operator
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
            if namespace == "c10d":
                kernel = _make_nested_c10d_kernel(overload, canonical)
                if native is None:
                    lib.impl(name, kernel, "ADInplaceOrView")
                else:
                    nested[f"c10d::{name}"] = kernel
        if namespace == "_c10d_functional":
            wait = ns_ops.wait_tensor.default
            for key in _AUTOGRAD_KEYS:
                lib.impl("wait_tensor", _wait_kernel(wait), key)
    if native is not None:
        native.install(nested)
        native.set_enabled(_STATE.enabled)
        _NATIVE = native
        _NATIVE_ENDS = native.ends
    # Every Python wait on a Work goes through the class attribute (pybind method).
    dist.Work.wait = _work_wait
    import torch.distributed._functional_collectives as funcol

    _FC_WAIT = funcol.wait_tensor
    funcol.wait_tensor = _wait_tensor  # looked up at call time by AsyncCollectiveTensor


def uninstall() -> None:
    """Remove the recording kernels and the wait wrappers again (the overhead benchmark's
    baseline runs without them); install() registers them anew."""
    global _FC_WAIT, _NATIVE
    while _LIBS:
        _LIBS.pop()._destroy()
    if _NATIVE is not None:
        _NATIVE.uninstall()
        _NATIVE = None
    dist.Work.wait = _WORK_WAIT
    if _FC_WAIT is not None:
        sys.modules["torch.distributed._functional_collectives"].wait_tensor = _FC_WAIT
        _FC_WAIT = None


def enable(on: bool = True) -> None:
    """Start (or stop) recording ops; the kernels stay installed either way. The thread that
    enables recording is the training thread, whose waits are stamped."""
    if on:
        _STATE.thread = threading.get_ident()
    _STATE.enabled = on
    if _NATIVE is not None:
        _NATIVE.set_enabled(on)


def impl() -> str:
    """Which kernel ties functional collectives to their rows: "native" (capture_native's C++
    kernel) or "python"; "none" before install()."""
    if not _LIBS:
        return "none"
    return "native" if _NATIVE is not None else "python"


def set_step(step: int) -> None:
    """Training step stamped on the ops issued from now on (-1: outside steps)."""
    _STATE.step = step


def set_phase(phase: str) -> None:
    """Phase (fwd, bwd, optim, fwd_bwd, other) stamped on the ops issued from now on."""
    _STATE.phase = phase


def _waits(table: _Table, n: int) -> tuple[list, list, list]:
    """(t_wait_start_ns, t_wait_end_ns, wait_ns) of the first ``n`` rows of ``table``."""
    starts: list[int | None] = []
    ends: list[int | None] = []
    waits: list[int | None] = []
    for i in range(n):
        w0 = table.w_start[i]
        w1 = table.w_end[i]
        if w0 == _BLOCKING:
            w0, w1 = table.rows[i][-1], table.t_end[i]
        if w0 is None:  # never blocked on
            w0, w1, w = None, None, 0
        elif w0 < 0 or w1 is None:  # unknown; or a blocking op that never completed
            w0, w1, w = None, None, None
        else:
            w = w1 - w0
        starts.append(w0)
        ends.append(w1)
        waits.append(w)
    return starts, ends, waits


def records() -> list[OpRecord]:
    """Everything recorded so far in this process (issue order), one OpRecord per op (their
    waits: :func:`frame`)."""
    table = _STATE.table
    # Rows and their end slots are appended one after the other, maybe on another thread.
    n = min(len(table.rows), len(table.t_end))
    ends = _ends(table, n)
    return [OpRecord(*row, t_end) for row, t_end in zip(table.rows[:n], ends, strict=True)]


def _ends(table: _Table, n: int) -> list[int | None]:
    """``t_end_ns`` of the first ``n`` rows of ``table``, with the native kernel's stamps."""
    ends = table.t_end[:n]
    # A copy first: functional ops on another thread (autograd's) may add slots meanwhile.
    slotted = [(r, slot) for r, slot in list(table.slots.items()) if r < n and ends[r] is None]
    if slotted and _NATIVE_ENDS is not None:
        stamps = _NATIVE_ENDS([slot for _, slot in slotted])
        for (row, _), stamp in zip(slotted, stamps, strict=True):
            ends[row] = stamp or None  # 0: not completed (yet)
    return ends


def frame() -> pd.DataFrame:
    """The recorded ops as a table: the columns of :class:`OpRecord` in order, then
    :data:`WAIT_COLUMNS`; integers as int64 and the times that may be unknown (``t_end_ns``,
    the wait columns) as nullable Int64 (built directly: via float64, epoch ns would round to
    256 ns)."""
    import pandas as pd  # only here: recording ranks import this module before pandas is needed

    table = _STATE.table
    n = min(len(table.rows), len(table.w_end))  # w_end is appended last (_record)
    ops = pd.DataFrame.from_records(table.rows[:n], columns=list(COLUMNS[:-1]))
    for col in ("group_size", "peer", "root", "numel", "bytes", "bytes_out", "seq", "step"):
        ops[col] = ops[col].astype("int64")
    ops["t_issue_ns"] = ops["t_issue_ns"].astype("int64")
    ops["t_end_ns"] = pd.array(_ends(table, n), dtype="Int64")
    for col, values in zip(WAIT_COLUMNS, _waits(table, n), strict=True):
        ops[col] = pd.array(values, dtype="Int64")
    return ops


def finish() -> None:
    """Stop recording and release every Work and tensor the capture still holds.

    Call before ``destroy_process_group``: a gloo Work that outlives its process group is
    destroyed during interpreter teardown and aborts the process (SIGABRT after the traces were
    written). The waiter thread is drained (every work is complete by the final barrier) and
    the poller forgets works their issuer never waited on.
    """
    enable(False)
    _WAITER.drain()
    _POLLER.drop_all()
    _KEEP.clear()
    _STATE.pending.clear()
    _STATE.groups.clear()
    _STATE.backward_rows = []


def reset() -> None:
    """Forget every recorded op and sequence number (late completions go to the old table)."""
    with _STATE.lock:
        _STATE.table = _Table()
        _STATE.seq.clear()
        _STATE.pending.clear()
        _STATE.groups.clear()
        _STATE.backward_rows = []
        _STATE.callback_task = -1
        _KEEP.clear()
