# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.cluster.shaping import qdisc_snapshot, qdisc_stats, shaped  # noqa: F401
from commscope.spec.link import LinkShape, check_shape_supported  # noqa: F401
