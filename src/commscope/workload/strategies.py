# TRANSITIONAL SHIM (issue 9): remove after imports are updated
from commscope.spec.models import MODEL_KINDS, VISION_KINDS, model_config  # noqa: F401
from commscope.spec.plan import (  # noqa: F401
    BUILTIN_STRATEGIES,
    DIMS,
    PP_SCHEDULES,
    ParallelPlan,
    validate_cell,
    validate_plan,
)
from commscope.workload.parallelize import tp_plan  # noqa: F401
from commscope.workload.trainer import StepLog, Trainer  # noqa: F401
