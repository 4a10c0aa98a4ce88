"""What a data configuration will hold in memory, checked before anything is allocated.

The data is built in the driver (``build_data``, before Ray starts) and then ``ray.put``
once into Ray's object store, which takes 30% of the machine's memory unless told
otherwise. A configuration whose arrays cannot fit would otherwise run for minutes and
end in swapping or an out-of-memory kill with no hint of the knob that avoids it (the
pooled synthetic form at 20M samples and 1M clients: >400 s, 13.9 GB RSS). The estimates
are arithmetic on the config (and on a table's Parquet footers), never an allocation:

- ``held``: the arrays the data object holds, and so what ``ray.put`` copies;
- ``peak``: what the driver holds at most while building them (temporaries included).

:func:`require` compares them with the memory this machine has (psutil, else
``/proc/meminfo``): ``2 x held`` (the driver's copy and the object store's) must fit in
the available memory, as must the driver's peak while building, and ``held`` must fit in
the object store's default share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fedray.core.spec import ConfigError

OBJECT_STORE_SHARE = 0.3  # Ray's default object store: 30% of the machine's memory
PER_CLIENT_BYTES = 2500  # a pooled dataset's index arrays, generator and summary per client
#                          (measured: 2.2 KB RSS per client at 20 samples per client)
PER_ROW_BYTES = 64  # a table's grouping, ordering and split arrays per row
FLOAT32, INT64 = 4, 8
GB = 1e9


@dataclass(frozen=True)
class Estimate:
    """Bytes a data configuration materializes: ``held`` by the data object (what
    ``ray.put`` copies; 0 when only a path crosses Ray) and ``peak`` in the driver while
    building; ``knob`` is the setting that makes it smaller."""

    held: int
    peak: int
    knob: str


def machine_memory() -> tuple[int, int] | None:
    """``(available, total)`` bytes of this machine's memory, or None where neither psutil
    nor ``/proc/meminfo`` tells."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            info = {k: int(v.split()[0]) * 1024 for k, v in
                    (line.split(":", 1) for line in fh if ":" in line)}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError):
        return None


def pooled(samples: int, features: int, num_clients: int, knob: str,
           temporaries: float = 1.0) -> Estimate:
    """A pooled in-memory dataset split among the clients (:class:`fedray.data.federated.
    FederatedData`): float32 inputs, int64 labels, one int64 index and one int64 sample id
    per sample (:class:`fedray.data.datasets.Dataset`) and the per-client overhead;
    building it holds ``temporaries`` extra copies of the inputs."""
    x = samples * features * FLOAT32
    held = x + samples * 3 * INT64 + num_clients * PER_CLIENT_BYTES
    return Estimate(held, int(held + temporaries * x), knob)


def remote_ray(ray_address: str | None) -> bool:
    """Whether the run joins a Ray elsewhere (``runtime.ray_address`` or ``RAY_ADDRESS``,
    other than ``local``): this machine's memory then does not bound it."""
    address = ray_address or os.environ.get("RAY_ADDRESS")
    return bool(address) and address != "local"


def require(field: str, value: object, estimate: Estimate,
            ray_address: str | None = None) -> None:
    """Raise a :class:`ConfigError` on ``field`` when ``estimate`` does not fit this
    machine: the estimate in GB, the limit and the knob that avoids it. The object store
    share is not checked against a remote cluster (``ray_address``), whose size this
    machine does not know."""
    mem = machine_memory()
    if mem is None:
        return
    available, total = mem
    store = int(OBJECT_STORE_SHARE * total)
    need = max(estimate.peak, 2 * estimate.held)  # building; then the driver's + the store's
    if need > available:
        raise ConfigError(field, value, (
            f"data that fits in memory: this configuration materializes about "
            f"{need / GB:.1f} GB before Ray starts (at most {estimate.peak / GB:.1f} GB while "
            f"the driver builds it, then the {estimate.held / GB:.1f} GB it holds copied "
            f"once into Ray's object store) and this machine has {available / GB:.1f} GB "
            f"available; {estimate.knob}"))
    if estimate.held > store and not remote_ray(ray_address):
        raise ConfigError(field, value, (
            f"data that fits in Ray's object store: this configuration holds about "
            f"{estimate.held / GB:.1f} GB, ray.put once, and the object store gets "
            f"{OBJECT_STORE_SHARE:.0%} of this machine's {total / GB:.1f} GB by default "
            f"({store / GB:.1f} GB); {estimate.knob}"))


__all__ = ["Estimate", "machine_memory", "pooled", "require"]
