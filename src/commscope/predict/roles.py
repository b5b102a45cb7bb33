"""Ranks of one role issue the same ops, each on its own groups: a prediction's op table, its
rank x rank sends and its per-rank summaries from one emulated rank per role.

What a rank of a dense GPT issues under a dp x tp x pp plan depends on its pipeline stage only:
every rank of stage s runs the same layers, schedule and buckets, each on *its own* TP, DP and
PP groups (MoE: on its expert-parallel coordinate; vision: on nothing). :func:`build_roles`
emulates the first rank of each role (its (pp, ep) coordinates), writes the groups of its ops as
:class:`GroupRef` (a mesh dimension and positions along it, or a literal list of ranks) and
peers and roots as positions in those groups, and :class:`RoleOps` relabels that template onto
every rank of the role with vectorized mesh arithmetic. At 16,384 GPUs that is a handful of
emulated ranks instead of 16,384.

The symmetry is checked, not assumed: the role's last rank is emulated too and must come out
identical to the relabelled template (ops and FLOPs), and a peer or root outside its op's group
has no position; a role that fails either is emulated rank by rank, as before, so a change to
the emulator can cost speed but never correctness.

The traffic model is applied the same way (:meth:`RoleOps.sends`): what a rank sends for an op
depends on the op, its size, the group's size and the rank's position in the group (and the
root's and peer's), not on the ranks' labels, so :func:`~commscope.collectives.traffic.\
op_destinations` runs once per (op kind, position) on the group ``0..n-1`` and its destinations
are mapped back onto each rank's group. The rows come out in the order
:func:`~commscope.collectives.traffic.op_sends` makes them for each sender, so the sums that
build the matrices add the same numbers in the same order: the results are identical to the
per-rank path's, bit for bit (tests/unit/test_predict_scale.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from commscope.collectives.traffic import DEFAULT_BACKEND, op_destinations, op_sends
from commscope.spec.plan import ParallelPlan

# A group that is no mesh group (e.g. MoE's DDP over every rank): the same ranks for every rank.
LITERAL = "literal"
# Dimensions that tell roles apart: the pipeline stage (which layers, which end of the pipe) and
# the expert-parallel coordinate (which experts). TP and DP coordinates only pick the groups.
ROLE_DIMS = ("pp", "ep")
# Columns of the ops table the relabelling rewrites; every other column is the template's.
RANK, NODE, LOCAL_RANK, GROUP, PEER, ROOT = (
    "rank",
    "node",
    "local_rank",
    "group_ranks",
    "peer",
    "root",
)

Rows = list[tuple]
RankOps = Callable[[int], tuple[Rows, float]]


@dataclass(frozen=True)
class GroupRef:
    """A group relative to the rank that uses it: the rank's group along mesh dimension
    ``dim`` (all of it when ``positions`` is None, else those positions of it, in that order),
    or with ``dim == LITERAL`` the ranks ``positions`` whoever uses it."""

    dim: str
    positions: tuple[int, ...] | None = None


class Mesh:
    """The plan's device mesh as arithmetic on arrays of ranks (row-major, as
    :meth:`ParallelPlan.group_of`): coordinates, groups, positions in groups, group strings."""

    def __init__(self, plan: ParallelPlan, world: int) -> None:
        shape, names = plan.mesh_shape()
        self.world = world
        self.dims: dict[str, tuple[int, int]] = {}
        stride = 1
        for size, name in zip(reversed(shape), reversed(names), strict=True):
            self.dims[name] = (size, stride)
            stride *= size
        self._texts: dict[tuple[GroupRef, int], str] = {}

    def coords(self, dim: str, ranks: np.ndarray) -> np.ndarray:
        """Each rank's index along ``dim`` (0 along a dimension of size 1)."""
        if dim not in self.dims:
            return np.zeros(len(ranks), dtype=np.int64)
        size, stride = self.dims[dim]
        return (ranks // stride) % size

    def base(self, ref: GroupRef, ranks: np.ndarray) -> np.ndarray:
        """The first rank of each rank's group along ``ref.dim`` (0 for a literal group)."""
        if ref.dim == LITERAL:
            return np.zeros(len(ranks), dtype=np.int64)
        return ranks - self.coords(ref.dim, ranks) * self.dims[ref.dim][1]

    def offsets(self, ref: GroupRef) -> np.ndarray:
        """The group's members relative to :meth:`base`, in group order."""
        if ref.dim == LITERAL:
            return np.asarray(ref.positions, dtype=np.int64)
        size, stride = self.dims[ref.dim]
        pos = range(size) if ref.positions is None else ref.positions
        return np.asarray(pos, dtype=np.int64) * stride

    def members(self, ref: GroupRef, ranks: np.ndarray) -> np.ndarray:
        """Each rank's group: one row per rank, members in group order."""
        return self.base(ref, ranks)[:, None] + self.offsets(ref)[None, :]

    def index_in(self, ref: GroupRef, ranks: np.ndarray) -> np.ndarray:
        """Each rank's place in its group (the first, as ``list.index``); -1 if not in it."""
        if ref.dim == LITERAL:
            first: dict[int, int] = {}
            for i, m in enumerate(ref.positions or ()):
                first.setdefault(m, i)
            return np.asarray([first.get(int(r), -1) for r in ranks], dtype=np.int64)
        coord = self.coords(ref.dim, ranks)
        if ref.positions is None:
            return coord
        place = np.full(self.dims[ref.dim][0], -1, dtype=np.int64)
        for i, p in reversed(list(enumerate(ref.positions))):
            place[p] = i
        return place[coord]

    def texts(self, ref: GroupRef, ranks: np.ndarray) -> np.ndarray:
        """Each rank's group as the ops table writes it (``"0,8,16"``), one string object per
        distinct group (rows of one group share it)."""
        distinct, inverse = self.distinct_texts(ref, ranks)
        return distinct[inverse]

    def distinct_texts(self, ref: GroupRef, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct groups of ``ranks`` as strings, and which one each rank has."""
        base = self.base(ref, ranks)
        uniq, inverse = np.unique(base, return_inverse=True)
        offsets = self.offsets(ref)
        out = np.empty(len(uniq), dtype=object)
        for i, b in enumerate(uniq.tolist()):
            key = (ref, b)
            if key not in self._texts:
                self._texts[key] = ",".join(map(str, (b + offsets).tolist()))
            out[i] = self._texts[key]
        return out, inverse.reshape(-1)

    def ref_of(self, members: Sequence[int], rank: int) -> GroupRef:
        """``members`` (a group ``rank`` uses) relative to ``rank``: a mesh group of ``rank`` or
        part of one, else literal."""
        for dim, (size, stride) in self.dims.items():
            base = int(self.base(GroupRef(dim), np.asarray([rank]))[0])
            rel = [m - base for m in members]
            if all(r % stride == 0 and 0 <= r // stride < size for r in rel):
                pos = tuple(r // stride for r in rel)
                return GroupRef(dim, None if pos == tuple(range(size)) else pos)
        return GroupRef(LITERAL, tuple(int(m) for m in members))


@dataclass
class Role:
    """Ranks that issue the same ops on their own groups, and the ops of the first of them as
    emulated (``rows``). ``refs`` (one per row) are the rows' groups relative to the rank, and
    ``peer_pos`` / ``root_pos`` the peer's and root's places in them (-1: the row's own value,
    which is -1). A role emulated rank by rank has one rank and ``refs`` None: its rows are
    literal."""

    ranks: np.ndarray
    rows: Rows
    flops: float
    refs: list[GroupRef] | None = None
    peer_pos: list[int] = field(default_factory=list)
    root_pos: list[int] = field(default_factory=list)


@dataclass
class RoleOps:
    """One step's ops on every rank, held as one template per role (:func:`build_roles`).

    ``columns`` are the ops table's, ``rows`` tuples in that order; ``meta`` is what
    :meth:`frame` puts in ``attrs["predict"]`` (its ``flops`` key is filled per frame).
    """

    mesh: Mesh
    ranks_per_node: int
    columns: list[str]
    roles: list[Role]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._col = {c: i for i, c in enumerate(self.columns)}
        self.role_of = np.full(self.mesh.world, -1, dtype=np.int64)
        for i, role in enumerate(self.roles):
            self.role_of[role.ranks] = i

    @property
    def world(self) -> int:
        return self.mesh.world

    def _wanted(self, ranks: Iterable[int] | None) -> np.ndarray:
        if ranks is None:
            return np.arange(self.world, dtype=np.int64)
        wanted = np.unique(np.asarray(list(ranks), dtype=np.int64))
        if len(wanted) and (wanted[0] < 0 or wanted[-1] >= self.world):
            raise ValueError(f"ranks must be in 0..{self.world - 1}")
        return wanted

    def n_ops(self, ranks: Iterable[int] | None = None) -> int:
        """Rows of :meth:`frame` (without building it)."""
        counts = np.asarray([len(r.rows) for r in self.roles], dtype=np.int64)
        return int(counts[self.role_of[self._wanted(ranks)]].sum())

    def flops(self, ranks: Iterable[int] | None = None) -> dict[int, float]:
        """Compute FLOPs per rank, in rank order."""
        return {int(r): self.roles[self.role_of[r]].flops for r in self._wanted(ranks)}

    # ------------------------------------------------------------------ the ops table

    def rank_rows(self, rank: int) -> Rows:
        """One rank's rows, relabelled from its role's template."""
        role = self.roles[self.role_of[rank]]
        if role.refs is None:
            return role.rows
        return _relabel(self.mesh, self.ranks_per_node, self._col, role, rank)

    def rank_frame(self, rank: int) -> pd.DataFrame:
        """One rank's ops as a table (with :meth:`frame`'s ``attrs``)."""
        out = pd.DataFrame(self.rank_rows(rank), columns=self.columns)
        out.attrs["predict"] = self._attrs([rank])
        return out

    def _attrs(self, ranks: Iterable[int] | None) -> dict[str, Any]:
        meta = dict(self.meta)
        meta["flops"] = self.flops(ranks)
        return meta

    def frame(self, ranks: Iterable[int] | None = None) -> pd.DataFrame:
        """The ops table of ``ranks`` (default: all), rank by rank in issue order: the rows the
        emulator gives rank by rank, the same values and dtypes."""
        wanted = self._wanted(ranks)
        roles = self.role_of[wanted]
        counts = np.asarray([len(r.rows) for r in self.roles], dtype=np.int64)[roles]
        total = int(counts.sum())
        if total == 0:
            out = pd.DataFrame([], columns=self.columns)
            out.attrs["predict"] = self._attrs(wanted)
            return out
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        kinds = {c: self._kind(c) for c in self.columns}
        # String columns are filled with codes into their distinct values: pandas turns
        # millions of Python strings into its string column far slower than it takes codes.
        dtypes = {"int": np.int64, "str": np.int32, "object": object}
        cols = {c: np.empty(total, dtype=dtypes[k]) for c, k in kinds.items()}
        strings: dict[str, dict[str, int]] = {c: {} for c, k in kinds.items() if k == "str"}
        for i, role in enumerate(self.roles):
            sel = roles == i
            if not sel.any() or not role.rows:
                continue
            self._fill(cols, strings, role, wanted[sel], start[sel])
        columns = {
            c: pd.Index(list(strings[c])).take(v).array if c in strings else v
            for c, v in cols.items()
        }
        out = pd.DataFrame(columns, columns=self.columns)
        out.attrs["predict"] = self._attrs(wanted)
        return out

    def _kind(self, column: str) -> str:
        """``int`` where every template value is an int (pandas makes the rows' column
        int64), ``str`` where every one is a string, else ``object``."""
        j = self._col[column]
        values = [row[j] for role in self.roles for row in role.rows]
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            return "int"
        return "str" if all(isinstance(v, str) for v in values) else "object"

    def _fill(
        self,
        cols: dict[str, np.ndarray],
        strings: dict[str, dict[str, int]],
        role: Role,
        ranks: np.ndarray,
        start: np.ndarray,
    ) -> None:
        """Write ``role``'s rows for ``ranks`` (their first rows at ``start``); a string
        column gets codes into ``strings[column]`` (a value's code: its place in the dict)."""

        def coded(column: str, values: Sequence[Any]) -> np.ndarray:
            if column not in strings:
                out = np.empty(len(values), dtype=cols[column].dtype)
                out[:] = list(values)
                return out
            codes = strings[column]
            return np.asarray([codes.setdefault(v, len(codes)) for v in values], dtype=np.int32)

        k = len(role.rows)
        idx = start[:, None] + np.arange(k)[None, :]
        for c in self.columns:
            cols[c][idx] = coded(c, [row[self._col[c]] for row in role.rows])[None, :]
        if role.refs is None:
            return
        rpn = self.ranks_per_node
        cols[RANK][idx] = ranks[:, None]
        cols[NODE][idx] = (ranks // rpn)[:, None]
        cols[LOCAL_RANK][idx] = (ranks % rpn)[:, None]
        refs = role.refs
        for ref in dict.fromkeys(refs):
            at = [j for j, r in enumerate(refs) if r == ref]
            distinct, inverse = self.mesh.distinct_texts(ref, ranks)
            cols[GROUP][idx[:, at]] = coded(GROUP, distinct.tolist())[inverse][:, None]
            members = None
            for column, places in ((PEER, role.peer_pos), (ROOT, role.root_pos)):
                for pos in {places[j] for j in at if places[j] >= 0}:
                    members = self.mesh.members(ref, ranks) if members is None else members
                    rows = [j for j in at if places[j] == pos]
                    cols[column][idx[:, rows]] = members[:, pos][:, None]

    # ------------------------------------------------------------------ the traffic model

    def _kinds(self, role: Role, by: str) -> dict[tuple, int]:
        """The role's distinct ops (as :func:`op_sends` tells them apart: op, size, group,
        peer, root, element size and ``by``) with their counts, in first-issue order."""
        c = self._col
        kinds: dict[tuple, int] = {}
        assert role.refs is not None
        for row, ref, peer, root in zip(
            role.rows, role.refs, role.peer_pos, role.root_pos, strict=True
        ):
            numel, nbytes = int(row[c["numel"]]), int(row[c["bytes"]])
            ratio = nbytes // numel if numel > 0 else 0
            elem = ratio if numel > 0 and ratio > 0 else 1
            key = (row[c["op"]], nbytes, ref, peer, root, elem, row[c[by]])
            kinds[key] = kinds.get(key, 0) + 1
        return kinds

    def sends(self, by: str = "traffic", backend: str = DEFAULT_BACKEND) -> pd.DataFrame:
        """Every transfer of the step under ``backend``'s algorithms: ``src_rank``,
        ``dst_rank``, ``by``, ``bytes``, each op kind of each sender summed as
        :func:`~commscope.collectives.traffic.op_sends` sums it, in its row order (so a
        grouped sum of these rows is that of op_sends' rows, to the last bit)."""
        cache: dict[tuple, list[tuple[int, float]]] = {}
        src, dst, key, nbytes = [], [], [], []
        for role in self.roles:
            if role.refs is None:
                got = op_sends(self.rank_frame(int(role.ranks[0])), [by], backend)
                src.append(got["rank"].to_numpy(np.int64))
                dst.append(got["dst_rank"].to_numpy(np.int64))
                key.append(got[by].to_numpy(object))
                nbytes.append(got["bytes"].to_numpy(np.float64))
                continue
            for (op, size, ref, peer, root, elem, value), count in self._kinds(role, by).items():
                here = self.mesh.index_in(ref, role.ranks)
                places, inverse = np.unique(here, return_inverse=True)
                n = len(self.mesh.offsets(ref))
                table = [
                    _destinations(cache, op, size, n, int(h), peer, root, elem, backend)
                    for h in places.tolist()
                ]
                width = max((len(t) for t in table), default=0)
                if width == 0:
                    continue
                to = np.full((len(places), width), -1, dtype=np.int64)
                amount = np.zeros((len(places), width), dtype=np.float64)
                for i, t in enumerate(table):
                    for j, (d, b) in enumerate(t):
                        to[i, j], amount[i, j] = d, b
                to, amount = to[inverse.reshape(-1)], amount[inverse.reshape(-1)]
                valid = to >= 0
                offsets = self.mesh.offsets(ref)
                dest = self.mesh.base(ref, role.ranks)[:, None] + offsets[np.where(valid, to, 0)]
                src.append(np.broadcast_to(role.ranks[:, None], to.shape)[valid])
                dst.append(dest[valid])
                nbytes.append(amount[valid] * count)
                key.append(np.full(int(valid.sum()), value, dtype=object))
        if not src:
            return pd.DataFrame(
                {
                    "src_rank": np.empty(0, np.int64),
                    "dst_rank": np.empty(0, np.int64),
                    by: np.empty(0, object),
                    "bytes": np.empty(0, np.float64),
                }
            )
        # op_sends' order: sender by sender, each one's kinds in issue order (each role's
        # blocks are kind by kind, so a stable sort by sender gives exactly that). pandas
        # sums a group differently when the input is already sorted by group (reduceat)
        # than when it is not, so the same rows in another order could differ in the last bit.
        senders = np.concatenate(src)
        order = np.argsort(senders, kind="stable")
        return pd.DataFrame(
            {
                "src_rank": senders[order],
                "dst_rank": np.concatenate(dst)[order],
                by: np.concatenate(key)[order],
                "bytes": np.concatenate(nbytes)[order],
            }
        )

    def sent_classes(self, backend: str = DEFAULT_BACKEND) -> list[np.ndarray]:
        """The ranks in groups whose per-rank summaries (:func:`commscope.predict.compare.\
summarize`) differ only in ``rank`` and ``node``: one role's ranks whose every op sends as many
        bytes (as the summary counts them) as the first rank's. Under NCCL's rings that is the
        whole role; a rooted op (a broadcast's chain end sends nothing) or gloo's uneven chunks
        split it. Each array is ascending; its first rank stands for the group."""
        cache: dict[tuple, float] = {}
        out: list[np.ndarray] = []
        for role in self.roles:
            if role.refs is None or len(role.ranks) == 1:
                out.append(role.ranks)
                continue
            c = self._col
            columns = []
            seen: set[tuple] = set()
            for row, ref, peer, root in zip(
                role.rows, role.refs, role.peer_pos, role.root_pos, strict=True
            ):
                kind = (row[c["op"]], row[c["bytes"]], ref, peer, root)
                if kind in seen:
                    continue
                seen.add(kind)
                here = self.mesh.index_in(ref, role.ranks)
                places, inverse = np.unique(here, return_inverse=True)
                n = len(self.mesh.offsets(ref))
                sent = np.asarray(
                    [
                        _sent(cache, row[c["op"]], row[c["bytes"]], n, int(h), peer, root, backend)
                        for h in places.tolist()
                    ]
                )
                if (sent != sent[0]).any():
                    columns.append(sent[inverse.reshape(-1)])
            if not columns:
                out.append(role.ranks)
                continue
            _, label = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
            label = label.reshape(-1)
            order = np.argsort(label, kind="stable")
            cuts = np.flatnonzero(np.diff(label[order])) + 1
            out += sorted(np.split(role.ranks[order], cuts), key=lambda a: int(a[0]))
        return out


@lru_cache(maxsize=64)
def _canonical(n: int) -> list[int]:
    """The group 0..n-1 (shared: op_destinations only reads it)."""
    return list(range(n))


def _destinations(
    cache: dict[tuple, list[tuple[int, float]]],
    op: str,
    size: int,
    n: int,
    here: int,
    peer: int,
    root: int,
    elem: int,
    backend: str,
) -> list[tuple[int, float]]:
    """:func:`op_destinations` on the group 0..n-1 (destinations are places in the group), as
    :func:`op_sends` calls it (float size, the element size)."""
    key = (op, size, n, here, peer, root, elem, backend)
    if key not in cache:
        cache[key] = op_destinations(
            op, float(size), _canonical(n), here, peer, root, None, backend, elem
        )
    return cache[key]


def _sent(
    cache: dict[tuple, float],
    op: str,
    size: int,
    n: int,
    here: int,
    peer: int,
    root: int,
    backend: str,
) -> float:
    """What a rank sends for one op on the group 0..n-1, as the summary counts it
    (:func:`commscope.predict.compare.summarize`: the op's own size, element size 1)."""
    key = (op, size, n, here, peer, root, backend)
    if key not in cache:
        dests = op_destinations(op, size, _canonical(n), here, peer, root, backend=backend)
        cache[key] = sum(b for _, b in dests)
    return cache[key]


def _relabel(mesh: Mesh, rpn: int, col: dict[str, int], role: Role, rank: int) -> Rows:
    """``role``'s template rows as rank ``rank`` issues them."""
    assert role.refs is not None
    at = np.asarray([rank], dtype=np.int64)
    texts = {ref: mesh.texts(ref, at)[0] for ref in dict.fromkeys(role.refs)}
    members = {ref: mesh.members(ref, at)[0].tolist() for ref in texts}
    out = []
    places = zip(role.rows, role.refs, role.peer_pos, role.root_pos, strict=True)
    for row, ref, peer, root in places:
        values = list(row)
        values[col[RANK]] = rank
        values[col[NODE]], values[col[LOCAL_RANK]] = rank // rpn, rank % rpn
        values[col[GROUP]] = texts[ref]
        if peer >= 0:
            values[col[PEER]] = members[ref][peer]
        if root >= 0:
            values[col[ROOT]] = members[ref][root]
        out.append(tuple(values))
    return out


def _template(
    mesh: Mesh, col: dict[str, int], rows: Rows, rank: int
) -> tuple[list[GroupRef], list[int], list[int]] | None:
    """The groups of ``rank``'s rows relative to it, and the places of their peers and roots
    in them; None when a peer or root is outside its op's group (no place to relabel)."""
    refs, peers, roots = [], [], []
    known: dict[str, tuple[GroupRef, list[int]]] = {}
    for row in rows:
        text = row[col[GROUP]]
        if text not in known:
            members = [int(m) for m in str(text).split(",") if m.strip()]
            known[text] = (mesh.ref_of(members, rank), members)
        ref, members = known[text]
        places = []
        for value in (int(row[col[PEER]]), int(row[col[ROOT]])):
            if value < 0:
                places.append(-1)
            elif value in members:
                places.append(members.index(value))
            else:
                return None
        refs.append(ref)
        peers.append(places[0])
        roots.append(places[1])
    return refs, peers, roots


def build_roles(
    plan: ParallelPlan,
    world: int,
    ranks_per_node: int,
    rank_ops: RankOps,
    columns: Sequence[str],
    meta: dict[str, Any] | None = None,
) -> RoleOps:
    """The step's ops on every rank from ``rank_ops`` (one rank's rows in ``columns`` order
    and its FLOPs), called once per role and once more to check it (see the module
    docstring); ranks of a role that fails the check are emulated one by one."""
    mesh = Mesh(plan, world)
    col = {c: i for i, c in enumerate(columns)}
    ranks = np.arange(world, dtype=np.int64)
    keys = np.stack([mesh.coords(d, ranks) for d in ROLE_DIMS], axis=1)
    _, label = np.unique(keys, axis=0, return_inverse=True)
    label = label.reshape(-1)
    roles: list[Role] = []
    groups: dict[Hashable, np.ndarray] = {}
    for lab in dict.fromkeys(label.tolist()):
        groups[lab] = ranks[label == lab]
    for members in groups.values():
        first = int(members[0])
        rows, flops = rank_ops(first)
        shape = _template(mesh, col, rows, first)
        role = None if shape is None else Role(members, rows, flops, *shape)
        checked: dict[int, tuple[Rows, float]] = {first: (rows, flops)}
        if role is not None and len(members) > 1:
            last = int(members[-1])
            checked[last] = rank_ops(last)
            relabelled = _relabel(mesh, ranks_per_node, col, role, last)
            if checked[last] != (relabelled, flops):
                role = None
        if role is not None:
            roles.append(role)
            continue
        for r in members.tolist():
            rows_r, flops_r = checked.get(r) or rank_ops(r)
            roles.append(Role(np.asarray([r], dtype=np.int64), rows_r, flops_r))
    roles.sort(key=lambda r: int(r.ranks[0]))
    return RoleOps(mesh, ranks_per_node, list(columns), roles, dict(meta or {}))
