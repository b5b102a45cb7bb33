"""Pipeline schedules: the order ``torch.distributed.pipelining`` runs forwards and backwards
on one pipeline rank (GPipe, 1F1B, interleaved 1F1B)."""

from __future__ import annotations

from commscope.spec.plan import ParallelPlan


def schedule_actions(plan: ParallelPlan, pp_rank: int) -> list[tuple[str, int, int]]:
    """``("F"|"B", stage, microbatch)`` in the order ``torch.distributed.pipelining`` runs
    them on pipeline rank ``pp_rank`` (GPipe: all forwards, then all backwards; 1F1B: warm-up
    of ``stages - stage`` forwards as Schedule1F1B; interleaved: ``_get_1f1b_rank_ops``)."""
    m, p, v = plan.microbatches, plan.pp, plan.stages_per_rank
    if plan.pp_schedule == "gpipe":
        return [("F", pp_rank, i) for i in range(m)] + [("B", pp_rank, i) for i in range(m)]
    if plan.pp_schedule == "1f1b":
        warm = min(m, p - pp_rank)
        out = [("F", pp_rank, i) for i in range(warm)]
        fwd, bwd = warm, 0
        while bwd < m:
            out.append(("B", pp_rank, bwd))
            bwd += 1
            if fwd < m:
                out.append(("F", pp_rank, fwd))
                fwd += 1
        return out
    # Interleaved 1F1B, torch's ScheduleInterleaved1F1B._calculate_single_rank_operations.
    rounds = max(1, m // p)
    per_round = m // rounds
    warm = min((v - 1) * per_round + 2 * (p - 1 - pp_rank), m * v)
    total = m * v

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + pp_rank

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * p + pp_rank

    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}
    out = []
    for step in range(warm + (total - warm) + warm):
        if step < total:
            s = fwd_stage(step)
            out.append(("F", s, fwd_mb.setdefault(s, 0)))
            fwd_mb[s] += 1
        if step >= warm:
            s = bwd_stage(step)
            out.append(("B", s, bwd_mb.setdefault(s, 0)))
            bwd_mb[s] += 1
    return out
