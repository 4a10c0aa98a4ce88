"""Which device a piece of work runs on, decided where the work runs, from what Ray gave it.

Ray sets ``CUDA_VISIBLE_DEVICES`` only for a worker that was granted a GPU share; a worker
granted none still sees every GPU of its node. So the device is never taken from
``torch.cuda.is_available()`` alone: a worker uses CUDA only when ``ray.get_gpu_ids()`` is
non-empty (and then ``cuda`` is its granted GPU, device 0 of what it sees).

The per-run decisions (``runtime.device=auto`` and the placement timeout) are settled once,
where the run starts, by :func:`settle_runtime`, and travel inside the config, so the
executors, the driver and a Tune trial's placement group all read the same answer.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

LOCAL_PLACEMENT_TIMEOUT_S = 60.0
CLUSTER_PLACEMENT_TIMEOUT_S = 1800.0  # a GPU node of an autoscaling cluster boots in minutes

FATAL_DEVICE_ERRORS = (
    "cuda error", "illegal memory access", "device-side assert", "cublas_status_",
    "cudnn_status_", "unspecified launch failure", "misaligned address",
)


def device_for(gpu_ids: Sequence[Any], cuda_available: bool) -> str:
    """``cuda`` when Ray granted this worker a GPU and torch can use it, else ``cpu``.
    (A GPU share on a node without a usable CUDA, e.g. GPUs declared to a CPU-only test
    cluster, runs on the CPU; :func:`device_info` reports it.)"""
    return "cuda" if gpu_ids and cuda_available else "cpu"


def worker_device() -> str:
    """The device of the current Ray worker (see :func:`device_for`); ``cpu`` outside Ray."""
    import ray
    import torch

    gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    return device_for(gpu_ids, torch.cuda.is_available())


def device_info() -> dict[str, Any]:
    """What the current worker was given and uses: for ``ready()`` reports and checks."""
    import ray
    import torch

    gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    return {"device": device_for(gpu_ids, torch.cuda.is_available()),
            "gpu_ids": [str(g) for g in gpu_ids],
            "cuda_available": torch.cuda.is_available(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


def deterministic_env() -> dict[str, str]:
    """Environment a deterministic GPU process needs before CUDA initialises."""
    return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def configure_process(device: str, *, gpu_share: float = 0.0, deterministic: bool = False,
                      threads: int | None = None) -> None:
    """Per-process torch settings of an executor or task, before it touches CUDA.

    ``deterministic``: deterministic cuDNN/cuBLAS kernels (``torch.use_deterministic_
    algorithms``, ``CUBLAS_WORKSPACE_CONFIG``) and no TF32, so two runs on one GPU type give
    the same bits. ``gpu_share`` in (0, 1): caps this process's CUDA caching allocator at that
    fraction of the GPU (``torch.cuda.set_per_process_memory_fraction``) — Ray's
    ``num_gpus`` only counts, it enforces nothing, so without the cap one executor can starve
    the others on its GPU.
    """
    import torch

    if threads:
        torch.set_num_threads(threads)
    if deterministic and device.startswith("cuda"):  # CPU kernels are deterministic already
        for k, v in deterministic_env().items():
            os.environ.setdefault(k, v)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if device.startswith("cuda") and 0 < gpu_share < 1:
        torch.cuda.set_per_process_memory_fraction(gpu_share, 0)


GC_YOUNG = 50_000  # allocations between two young-generation collections in an actor


def settle_heap() -> None:
    """Once an actor (the driver, an executor) is set up: collect, freeze what survives
    (modules, the model, the data: never garbage, never walked by a collection again) and
    collect the young generation every :data:`GC_YOUNG` allocations instead of CPython's
    700.

    Why: a round of thousands of clients allocates hundreds of thousands of small objects
    (results, rows, generators), and with the default thresholds the collector ran every
    700 of them and now and then walked the whole heap. Cyclic garbage is still collected,
    later. :func:`free_device_memory` unfreezes first, so an actor kept warm does not keep
    a finished run's objects frozen."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 10, 10)


def free_device_memory() -> None:
    """Collect garbage and hand CUDA's cached blocks back (an executor kept warm between runs,
    :mod:`fedray.runtime.warm`, keeps none of a finished run's tensors)."""
    import gc
    import sys

    gc.unfreeze()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def is_fatal_device_error(exc: BaseException) -> bool:
    """True for errors after which the process's CUDA context is unusable (illegal memory
    access, device-side assert, …): every later kernel on it fails, so the process must go."""
    accel = getattr(__import__("torch"), "AcceleratorError", None)
    if accel is not None and isinstance(exc, accel):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(s in text for s in FATAL_DEVICE_ERRORS)


def local_resources() -> dict[str, float]:
    """The CPUs and GPUs a local Ray started here will see, found as Ray finds them (its
    cgroup-aware CPU count, its NVIDIA detection), without starting it."""
    try:
        from ray._private.utils import get_num_cpus

        cpus = float(get_num_cpus())
    except Exception:  # noqa: BLE001 — a Ray without the helper: the OS count
        cpus = float(os.cpu_count() or 1)
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        gpus = float(get_accelerator_manager_for_resource("GPU")
                     .get_current_node_num_accelerators())
    except Exception:  # noqa: BLE001 — no detection available: what CUDA_VISIBLE_DEVICES says
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = float(len([d for d in visible.split(",") if d.strip()])) if visible else 0.0
    return {"CPU": cpus, "GPU": gpus}


def settle_runtime(cfg: Any, local: bool, cluster_resources: dict[str, float]) -> Any:
    """``cfg`` with ``runtime.device`` and ``runtime.placement_timeout_s`` decided once.

    - ``device=auto`` on a local Ray this process started (it cannot grow) becomes ``cpu``
      when that Ray has no GPU; everywhere else ``auto`` stays, meaning each tier's
      ``num_gpus`` as written: on an autoscaling cluster the head may see no GPU while GPU
      nodes are still to come, so a GPU tier is a GPU request whatever the head sees.
    - ``placement_timeout_s`` unset becomes 60 s locally, 30 min on a cluster.
    """
    rt = cfg.runtime
    device = rt.device
    if device == "auto" and local and cluster_resources.get("GPU", 0) <= 0:
        device = "cpu"
    timeout = rt.placement_timeout_s
    if timeout is None:
        timeout = LOCAL_PLACEMENT_TIMEOUT_S if local else CLUSTER_PLACEMENT_TIMEOUT_S
    if device == rt.device and timeout == rt.placement_timeout_s:
        return cfg
    return dataclasses.replace(cfg, runtime=dataclasses.replace(
        rt, device=device, placement_timeout_s=timeout))


def run_on_device(fn: Callable[..., Any], *args: Any, num_gpus: float = 0.0,
                  num_cpus: float = 1.0, **kwargs: Any) -> Any:
    """``fn(*args, device=..., **kwargs)`` as a Ray task holding ``num_gpus`` of a GPU, with
    ``device`` the one that task was given (evaluation and other whole-model work of a job
    runs where the executors' models run, never on the entry process's CPU)."""
    import ray

    def task(*a: Any, **kw: Any) -> Any:
        configure_process(worker_device(), gpu_share=num_gpus)
        return fn(*a, device=worker_device(), **kw)

    remote = ray.remote(num_gpus=num_gpus, num_cpus=num_cpus, max_retries=0)(task)
    return ray.get(remote.remote(*args, **kwargs))


__all__ = ["GC_YOUNG", "configure_process", "device_for", "device_info",
           "is_fatal_device_error", "run_on_device", "settle_heap", "settle_runtime",
           "worker_device"]
