# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.plots.bench import bench_figures  # noqa: F401
