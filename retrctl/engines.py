"""Kept for compatibility: the engines moved to ``retrctl.train.engines``, checkpoint loading to ``retrctl.train.checkpoint`` (issue 13)."""

from retrctl.train.checkpoint import (  # noqa: F401
    RESTART,
    checkpoints,
    deepspeed_globals,
    load_tensors,
    rng_state,
    set_rng_state,
)
from retrctl.train.engines import (  # noqa: F401
    DeepSpeedEngine,
    Dist,
    PlainEngine,
    deepspeed_config,
    import_deepspeed,
    linear_schedule,
    setup_processes,
)
