"""The Ray runtime: driver, executors, client state, storage. Knows no method."""

from fedray.runtime.experiment import (
    Experiment,
    init_ray,
    resumable,
    resume_config,
    run_experiment,
)

__all__ = ["Experiment", "init_ray", "resumable", "resume_config", "run_experiment"]
