"""Device selection and the per-run runtime decisions (GPU readiness), without Ray: which
device a worker uses, how ``runtime.device=auto`` and the placement timeout are settled, the
config errors of impossible device settings, the deterministic mode's flags, and which
errors poison a CUDA context."""

from __future__ import annotations

import pytest
import torch

from fedray.core.config import ConfigError, load_config
from fedray.runtime.devices import (
    CLUSTER_PLACEMENT_TIMEOUT_S,
    LOCAL_PLACEMENT_TIMEOUT_S,
    configure_process,
    device_for,
    is_fatal_device_error,
    settle_runtime,
)
from fedray.runtime.pool import executor_bundle, executor_options, requested_resources

GPU_TIERS = "[{name: g, executors: 2, num_cpus: 1, num_gpus: 0.25}]"


WARM_RUNS = False  # conftest.warm_runs: it reads the session's free resources


def test_cuda_only_with_a_granted_gpu_share():
    assert device_for(["0"], cuda_available=True) == "cuda"
    # Ray leaves CUDA_VISIBLE_DEVICES unset for a worker granted no GPU: it must not use one
    assert device_for([], cuda_available=True) == "cpu"
    assert device_for(["0"], cuda_available=False) == "cpu"  # declared GPUs, CPU-only node


def test_auto_is_a_gpu_request_on_a_cluster_whatever_the_head_sees():
    cfg = load_config(None, [f"runtime.tiers={GPU_TIERS}"])
    assert cfg.runtime.device == "auto" and cfg.runtime.placement_timeout_s is None
    # an autoscaling cluster whose CPU head sees no GPU yet: the tier still asks for one
    remote = settle_runtime(cfg, local=False, cluster_resources={"CPU": 8.0})
    assert executor_options(remote, remote.runtime.tiers[0])["num_gpus"] == 0.25
    assert remote.runtime.placement_timeout_s == CLUSTER_PLACEMENT_TIMEOUT_S
    # a local Ray this run started without GPUs cannot grow: the run goes to the CPU
    local = settle_runtime(cfg, local=True, cluster_resources={"CPU": 2.0})
    assert local.runtime.device == "cpu"
    assert executor_options(local, local.runtime.tiers[0])["num_gpus"] == 0.0
    assert local.runtime.placement_timeout_s == LOCAL_PLACEMENT_TIMEOUT_S
    assert requested_resources(local)["GPU"] == 0.0
    with_gpu = settle_runtime(cfg, local=True, cluster_resources={"CPU": 2.0, "GPU": 1.0})
    assert with_gpu.runtime.device == "auto"
    assert requested_resources(with_gpu)["GPU"] == 0.5
    assert cfg.runtime.device == "auto"  # the input is not modified
    fixed = load_config(None, [f"runtime.tiers={GPU_TIERS}", "runtime.placement_timeout_s=5"])
    assert settle_runtime(fixed, False, {}).runtime.placement_timeout_s == 5


def test_settled_config_survives_a_round_trip_through_its_own_keys():
    """Tune trials rebuild their config from the sweep's settled device and timeout."""
    cfg = settle_runtime(load_config(None, [f"runtime.tiers={GPU_TIERS}"]), True, {})
    again = load_config(None, [f"runtime.device={cfg.runtime.device}",
                               f"runtime.placement_timeout_s={cfg.runtime.placement_timeout_s}",
                               f"runtime.tiers={GPU_TIERS}"])
    assert settle_runtime(again, False, {"GPU": 8.0}).runtime == cfg.runtime


def test_device_config_errors():
    with pytest.raises(ConfigError, match=r"runtime.tiers\[0\].num_gpus.*runtime.device=cuda"):
        load_config(None, ["runtime.device=cuda"])
    with pytest.raises(ConfigError, match=r"runtime.tiers\[0\].accelerator_type.*one type"):
        load_config(None, ["runtime.deterministic=true", f"runtime.tiers={GPU_TIERS}"])
    load_config(None, ["runtime.deterministic=true"])  # CPU tiers: nothing to pin
    load_config(None, ["runtime.deterministic=true", "runtime.device=cpu",
                       f"runtime.tiers={GPU_TIERS}"])
    with pytest.raises(ConfigError, match="runtime.min_accepted.*at most the 3 clients"):
        load_config(None, ["clients.num_clients=10", "clients.per_round=3",
                           "runtime.min_accepted=4"])
    with pytest.raises(ConfigError, match="runtime.placement_timeout_s"):
        load_config(None, ["runtime.placement_timeout_s=0"])


def test_one_gpu_type_per_tier_becomes_a_ray_resource():
    tiers = ("[{name: a, executors: 2, num_cpus: 1, num_gpus: 0.5, accelerator_type: A100},"
             " {name: c, executors: 1, num_cpus: 1}]")
    cfg = load_config(None, [f"runtime.tiers={tiers}", "runtime.deterministic=true"])
    a, c = cfg.runtime.tiers
    assert executor_options(cfg, a)["accelerator_type"] == "A100"
    assert executor_bundle(cfg, a) == {"CPU": 1.0, "GPU": 0.5, "accelerator_type:A100": 0.001}
    assert executor_bundle(cfg, c) == {"CPU": 1.0}
    assert requested_resources(cfg)["accelerator_type:A100"] == pytest.approx(0.002)
    cpu = load_config(None, [f"runtime.tiers={tiers}", "runtime.device=cpu"])
    assert "accelerator_type" not in executor_options(cpu, cpu.runtime.tiers[0])


def test_deterministic_mode_sets_the_kernel_flags_and_cpu_is_left_alone(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    try:
        configure_process("cpu", deterministic=True)
        assert not torch.are_deterministic_algorithms_enabled()
        configure_process("cuda", deterministic=True)  # no CUDA call needed for the flags
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(flags[0])
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = flags[1:]


def test_which_errors_poison_a_cuda_context():
    assert is_fatal_device_error(RuntimeError(
        "CUDA error: an illegal memory access was encountered"))
    assert is_fatal_device_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert is_fatal_device_error(RuntimeError(
        "CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`"))
    assert not is_fatal_device_error(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not is_fatal_device_error(RuntimeError("mat1 and mat2 must have the same dtype"))
    assert not is_fatal_device_error(ValueError("CUDA error"))


def test_settle_heap_freezes_and_raises_the_young_threshold_and_release_unfreezes():
    """An actor's heap after set-up is frozen and the young generation collected every
    GC_YOUNG allocations; free_device_memory (a warm actor's release) unfreezes."""
    import gc

    from fedray.runtime.devices import GC_YOUNG, free_device_memory, settle_heap

    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_threshold()[0] == GC_YOUNG and gc.get_freeze_count() > 0
        free_device_memory()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
