"""One local Ray cluster for a test module, leaving the test process as it found it: Ray's driver keeps its SIGTERM
handler and its environment variables (PYTHONBREAKPOINT, RAY_AUTH_MODE, ...) after `ray.shutdown()`, which would
change how later tests' forked children end on a signal."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


@contextmanager
def ray_left_as_found() -> Iterator[None]:
    """Put back the signal handlers and environment variables Ray's driver changes."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    environment = dict(os.environ)
    try:
        yield
    finally:
        import ray

        ray.shutdown()
        for number, handler in handlers.items():
            signal.signal(number, handler)
        os.environ.clear()
        os.environ.update(environment)


@contextmanager
def local_ray_cluster(num_cpus: int = 2, **env_vars: str) -> Iterator[None]:
    """`ray.init` on `num_cpus` CPUs whose workers import this checkout's `tests` package (and see `env_vars`)."""
    import ray

    with ray_left_as_found():
        ray.init(
            num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": REPO, **env_vars}},
        )
        yield
