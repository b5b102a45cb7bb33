"""MoE trace repair: the exact per-destination bytes of MoE token all-to-alls recorded
without them, from the MoE model's routing table (``moe.parquet``,
:data:`commscope.contracts.ROUTING_FILE`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.collectives.traffic import parse_splits
from commscope.contracts import SPLIT_COLUMN, parse_ranks


def alltoall_splits_from_routing(ops: pd.DataFrame, routing: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with the exact per-destination bytes (``split_bytes``) of the MoE token
    all-to-alls filled in from the routing table, for traces recorded without them.

    The MoE layer (commscope.workload.moe) issues per forward a dispatch all-to-all that sends
    ``tokens_sent[d]`` rows to EP rank d and receives ``tokens_received[d]``, a combine that
    sends the received rows back (``tokens_received[d]`` to d), and in backward the mirror of
    each (combine's backward sends as the dispatch, dispatch's as the combine); every row is one
    token of ``token_bytes`` = hidden x element size. ``routing`` (``moe.parquet``: ``rank``,
    ``step``, ``layer``, ``dst_rank``, ``tokens_sent``, ``tokens_received``; a layer run twice in
    a step repeats its rows in order) gives those counts per forward, but not which op record
    is which, so each record is matched by its totals: an all-to-all of the same rank, step and
    group whose input ``bytes`` and ``bytes_out`` are ``token_bytes`` times the sent and
    received (dispatch pattern) or received and sent (combine pattern) token totals of one
    forward. ``token_bytes`` is the value that explains the most records of the cell. A record
    gets ``split_bytes`` = ``token_bytes`` x the token counts of its pattern in group-rank order
    ("b0,b1,...") only when every forward it matches gives the same splits; other records
    (the per-expert count all-to-all, which is an even split, ambiguous matches, other ops)
    and records that already carry ``split_bytes`` are left as they are.
    """
    need = {"rank", "step", "layer", "dst_rank", "tokens_sent", "tokens_received"}
    if ops.empty or routing.empty or not need <= set(routing.columns) or "op" not in ops:
        return ops
    todo = ops["op"] == "alltoall"
    if SPLIT_COLUMN in ops:
        todo &= ops[SPLIT_COLUMN].map(parse_splits).isna()
    if not todo.any():
        return ops
    forwards = _routing_forwards(routing[list(need)])
    matches = _record_matches(ops.loc[todo], forwards)
    if not matches:
        return ops
    votes = pd.Series([tb for found in matches.values() for tb in {f[0] for f in found}])
    token_bytes = int(votes.mode().iloc[0])
    chosen: dict[Any, tuple[int, ...]] = {}
    tied: dict[tuple[Any, ...], list[Any]] = {}
    for idx, found in matches.items():
        patterns = {(tokens, dispatch) for tb, tokens, dispatch in found if tb == token_bytes}
        if len({tokens for tokens, _ in patterns}) == 1:
            chosen[idx] = patterns.pop()[0]
        elif len(patterns) == 2 and {d for _, d in patterns} == {True, False}:
            # One forward whose sent and received totals are equal: both patterns fit.
            key = (ops.at[idx, "rank"], ops.at[idx, "step"], _phase_of(ops, idx), *patterns)
            tied.setdefault(key, []).append(idx)
    # In a forward the dispatch (sent pattern) precedes the combine (received pattern), and in
    # backward the combine's mirror (sent pattern) precedes the dispatch's: within a phase the
    # records tied to one forward alternate sent, received in issue order.
    for key, idxs in tied.items():
        if len(idxs) % 2:
            continue
        by_pattern = {dispatch: tokens for tokens, dispatch in key[3:]}
        order = sorted(idxs, key=lambda i: int(ops.at[i, "seq"]) if "seq" in ops else i)
        for k, idx in enumerate(order):
            chosen[idx] = by_pattern[k % 2 == 0]
    splits = {idx: ",".join(str(token_bytes * t) for t in tokens) for idx, tokens in chosen.items()}
    if not splits:
        return ops
    out = ops.copy()
    if SPLIT_COLUMN not in out:
        out[SPLIT_COLUMN] = pd.Series(None, index=out.index, dtype="object")
    else:
        out[SPLIT_COLUMN] = out[SPLIT_COLUMN].astype("object")
    out.loc[list(splits), SPLIT_COLUMN] = pd.Series(splits)
    return out


Forwards = dict[tuple[int, int], list[dict[int, tuple[int, int]]]]


def _routing_forwards(routing: pd.DataFrame) -> Forwards:
    """Per (rank, step), each forward's token counts ``{dst_rank: (sent, received)}``, in
    order, from the routing table's rows."""
    rows = routing.copy()
    # A layer that ran several forwards in one step (microbatches) repeats its rows in order.
    rows["forward"] = rows.groupby(["rank", "step", "layer", "dst_rank"]).cumcount()
    forwards: Forwards = {}
    for (rank, step, _layer, _fwd), sub in rows.groupby(
        ["rank", "step", "layer", "forward"], sort=False
    ):
        counts = {
            int(d): (int(t), int(r))
            for d, t, r in sub[["dst_rank", "tokens_sent", "tokens_received"]].itertuples(
                index=False, name=None
            )
        }
        forwards.setdefault((int(rank), int(step)), []).append(counts)
    return forwards


def _record_matches(
    candidates: pd.DataFrame, forwards: Forwards
) -> dict[Any, list[tuple[int, tuple[int, ...], bool]]]:
    """Per all-to-all record of ``candidates``: every (token bytes, out tokens in group
    order, dispatch pattern?) under which a forward of its rank and step explains its input
    and output bytes (see :func:`alltoall_splits_from_routing`)."""
    matches: dict[Any, list[tuple[int, tuple[int, ...], bool]]] = {}
    candidates = candidates[["rank", "step", "group_ranks", "bytes", "bytes_out"]]
    for idx, rank, step, group_ranks, size, size_out in candidates.itertuples(name=None):
        members = parse_ranks(group_ranks)
        if pd.isna(step) or pd.isna(size) or pd.isna(size_out):
            continue
        found = []
        for counts in forwards.get((int(rank), int(step)), []):
            if set(counts) != set(members):
                continue
            sent = [counts[m][0] for m in members]
            received = [counts[m][1] for m in members]
            for first, (out_tokens, in_tokens) in enumerate(((sent, received), (received, sent))):
                token_bytes = _token_bytes(int(size), int(size_out), out_tokens, in_tokens)
                if token_bytes:
                    found.append((token_bytes, tuple(out_tokens), first == 0))
        if found:
            matches[idx] = found
    return matches


def _phase_of(ops: pd.DataFrame, idx: Any) -> Any:
    return ops.at[idx, "phase"] if "phase" in ops else None


def _token_bytes(size: int, size_out: int, out_tokens: list[int], in_tokens: list[int]) -> int:
    """The bytes per token under which an all-to-all of ``size`` bytes in and ``size_out`` out
    sends ``out_tokens`` and receives ``in_tokens`` rows in total; 0 when none does."""
    sent, received = sum(out_tokens), sum(in_tokens)
    if sent > 0 and size % sent == 0:
        token_bytes = size // sent
        return token_bytes if token_bytes > 0 and size_out == token_bytes * received else 0
    # A rank that sends no token (its experts got none to return) still receives some.
    if sent == 0 == size and received > 0 and size_out % received == 0:
        return size_out // received
    return 0
