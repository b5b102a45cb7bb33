"""Collective microbenchmarks: tidy tables, nccl-tests bandwidths, alpha-beta fits
(:mod:`.analysis`) and the run on the cluster (:mod:`.run`); the worker that measures is
:mod:`commscope.workload.microbench`, the figures are :mod:`commscope.plots.bench`."""
