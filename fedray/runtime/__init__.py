"""The Ray runtime: driver, executors, placement, devices. Knows no method: it finds the
configured one through :mod:`fedray.core.registry` and talks to it through the typed contracts of
:mod:`fedray.methods.base`."""

from fedray.runtime.experiment import (
    Experiment,
    init_ray,
    resumable,
    resume_config,
    run_experiment,
)
from fedray.runtime.warm import release_warm

__all__ = ["Experiment", "init_ray", "release_warm", "resumable", "resume_config",
           "run_experiment"]
