# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.predict.ops import predict_ops  # noqa: F401
