"""A local Ray cluster for the Ray tests: started with retries, since Ray gives its daemons 30 s to come up,
which a loaded 2-core box can miss; a failed start's daemons are killed before the next try."""

from __future__ import annotations


def init_local(**kwargs) -> None:
    """``ray.init(num_cpus=4, ...)``: more logical CPUs than cores, so actors holding every slot cannot starve
    Ray's own tasks; ``kwargs`` go to ``ray.init``."""
    import psutil  # a dependency of Ray
    import ray

    for attempt in range(3):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, logging_level="WARNING", **kwargs)
            return
        except Exception:
            ray.shutdown()
            for p in psutil.Process().children(recursive=True):
                if p.pid not in before:
                    p.kill()
            if attempt == 2:
                raise
