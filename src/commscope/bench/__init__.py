"""Collective microbenchmarks: tidy tables, nccl-tests bandwidths, alpha-beta fits
(:mod:`.analysis`) and their figures (:mod:`.figures`); the worker that measures is
:mod:`commscope.workload.microbench`."""
