"""Preparation speed of the natural-split readers (issue #31, deliverable 6): how long a
first build of the population cache takes from the dataset's own files, at the real size,
with what peak RSS, and how long a second build (a cache hit) takes.

Datasets, generated here once in their real on-disk formats (``--data-dir``, kept between
invocations):

- ``stackoverflow``: TFF's ``stackoverflow_train.h5`` / ``_test.h5`` (``examples/<client>/
  tokens``, one sentence per example) with ``--users`` clients (342,477 in TFF's train
  split), ``--sentences`` sentences each (10), words drawn from a Zipf-distributed 50,000-word
  list, plus a ``stackoverflow.word_count`` file; read as TFF's 10,000-word next-word task.
- ``femnist``: LEAF's FEMNIST JSON shards (``train/`` and ``test/``, ``--shards`` files
  each, 35 in LEAF) with ``--users`` writers (3,550) of 784-float rows (≈ 805 K in all, 90 %
  train), as ``benchmarks/femnist_workload.py`` writes them.
- ``flair``: pfl-research's ``flair_federated.hdf5`` layout with ``--users`` train users
  (41,131 in FLAIR) and an eighth as many val and test users each, images a user drawn
  around FLAIR's mean (8.4; 1..30 here), 17 coarse and 40 fine labels; photos of
  ``--image-size`` pixels (default 64: FLAIR's own 256 would be an 84 GB file).

Each build runs in a fresh child process (``fedray.data.population.build_client_data``);
the reported peak is the summed RSS of the child and the reader's pool processes, sampled
every 20 ms. With ``--score``, two more children map the built entry and score a linear
model (flattened input → labels, one thread) on the global test set, once on the in-memory
sample (``eval.global_test_set=sample``) and once on the whole test partition streamed from
the cache (``all``): seconds, rows scored and peak RSS, with the part of it that is not
file-backed (``anon``: RSS less the mapped cache pages, which the kernel can drop). Usage::

    .venv/bin/python benchmarks/prep_speed.py --dataset stackoverflow
    .venv/bin/python benchmarks/prep_speed.py --dataset femnist
    .venv/bin/python benchmarks/prep_speed.py --dataset flair
    .venv/bin/python benchmarks/prep_speed.py --dataset flair --users 12000 --score

Targets (#31): a first build ≤ 60 s with peak RSS ≤ 2 GB, a second ≤ 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write_stackoverflow(root: str, users: int, sentences: int, seed: int = 0) -> None:
    import h5py

    stamp = os.path.join(root, "workload.json")
    want = {"users": users, "sentences": sentences, "seed": seed}
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return
    os.makedirs(root, exist_ok=True)
    g = np.random.default_rng(seed)
    lexicon = np.array([f"w{i}" for i in range(50_000)], dtype=object)
    counts = np.zeros(len(lexicon), np.int64)
    strings = h5py.string_dtype()
    for split, per in (("train", sentences), ("test", max(1, sentences // 5))):
        with h5py.File(os.path.join(root, f"stackoverflow_{split}.h5"), "w") as f:
            ex = f.create_group("examples")
            for u in range(users):
                lengths = g.integers(3, 30, per)
                ids = np.minimum(g.zipf(1.3, int(lengths.sum())) - 1, len(lexicon) - 1)
                if split == "train":
                    np.add.at(counts, ids, 1)
                words = lexicon[ids]
                cut = np.cumsum(lengths)[:-1]
                text = [" ".join(p) for p in np.split(words, cut)]
                ex.create_group(f"{u:08d}").create_dataset(
                    "tokens", data=np.array(text, dtype=object), dtype=strings)
    order = np.argsort(-counts, kind="stable")
    with open(os.path.join(root, "stackoverflow.word_count"), "w") as fh:
        fh.writelines(f"{lexicon[i]} {counts[i]}\n" for i in order if counts[i])
    json.dump(want, open(stamp, "w"))


def write_femnist(root: str, users: int, shards: int) -> None:
    sys.path.insert(0, HERE)
    import femnist_workload

    femnist_workload.SIZES = (180, 273)  # ≈ 227 rows a writer, ≈ 805 K at 3,550 writers
    femnist_workload.write(root, clients=users, shards=shards)


def write_flair(root: str, users: int, size: int, seed: int = 0) -> None:
    """FLAIR's HDF5 layout (pfl-research's prepare_dataset.py), written user by user."""
    import h5py

    path = os.path.join(root, "flair_federated.hdf5")
    if os.path.exists(path):
        return
    os.makedirs(root, exist_ok=True)
    g = np.random.default_rng(seed)
    parts = ["train"] * users + ["val"] * (users // 8) + ["test"] * (users // 8)
    with h5py.File(path + ".tmp", "w") as h5:
        for i, part in enumerate(parts):
            n = int(np.clip(g.geometric(1 / 8.4), 1, 30))
            u = f"/{part}/{i:08d}"
            rows = np.repeat(np.arange(n), 2).astype(np.uint16)
            h5[u + "/labels_row"] = rows
            h5[u + "/labels_col"] = g.integers(0, 17, 2 * n).astype(np.uint8)
            h5[u + "/fine_grained_labels_row"] = rows
            h5[u + "/fine_grained_labels_col"] = g.integers(0, 40, 2 * n).astype(np.uint16)
            h5[u + "/image_ids"] = np.asarray([f"{i}-{j}" for j in range(n)], dtype="S")
            h5.create_dataset(u + "/images", data=g.integers(0, 256, (n, size, size, 3),
                                                             dtype=np.uint8))
        h5["/metadata/label_mapping"] = json.dumps({f"l{i:02d}": i for i in range(17)})
        h5["/metadata/fine_grained_label_mapping"] = json.dumps(
            {f"f{i:02d}": i for i in range(40)})
    os.replace(path + ".tmp", path)


def overrides(dataset: str, root: str, cache: str, users: int) -> list[str]:
    common = [f"data.root={root}", f"data.cache_dir={cache}",
              f"clients.num_clients={users}", "data.min_samples=2", "eval.clients=sampled"]
    if dataset == "stackoverflow":
        return ["data.dataset=tff", *common]
    if dataset == "flair":
        return ["data.dataset=flair", "model.name=flair_resnet18", *common[:3],
                "data.min_samples=1", "eval.clients=sampled"]
    return ["data.dataset=leaf", *common]


CHILD = """
import json, sys, time
from fedray.core.config import load_config
from fedray.data.population import build_client_data
t = time.perf_counter()
pop = build_client_data(load_config(None, json.loads(sys.argv[1])))
print(json.dumps({"seconds": time.perf_counter() - t, "clients": pop.num_clients,
                  "rows": int(pop.offsets[-1])}))
"""


SCORE = """
import json, sys, time
import numpy as np, torch
from fedray.core.config import load_config
from fedray.data.population import build_client_data, global_test_set
from fedray.models.training import evaluate
torch.set_num_threads(1)
pop = build_client_data(load_config(None, json.loads(sys.argv[1])))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(),
                            torch.nn.Linear(int(np.prod(pop.input_shape)), pop.num_classes))
t = time.perf_counter()
scores = evaluate(model, *global_test_set(pop, sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - t, "rows": scores["n"],
                  "macro_ap": scores.get("macro_ap"), "accuracy": scores["accuracy"]}))
"""


def build(args: list[str], code: str = CHILD, *extra: str) -> dict:
    """``code`` (one build by default) in a fresh child; the peak of the summed RSS of the
    child and every process it starts (the reader's pool), sampled every 20 ms, and of its
    part that is not file-backed (``anon``)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, anon, most = 0, 0, 1
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        total, own, n = 0, 0, 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    m = p.memory_info()
                    total += m.rss
                    own += m.rss - m.shared
                    n += 1
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak, anon, most = max(peak, total), max(anon, own), max(most, n)
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"the child failed: {err.strip().splitlines()[-1]}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_summed_rss_gb": peak / 2**30,
            "peak_summed_anon_gb": anon / 2**30, "processes": most}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--dataset", choices=("stackoverflow", "femnist", "flair"), required=True)
    p.add_argument("--users", type=int, default=None,
                   help="clients (default the real size: 342,477 / 3,550 / 41,131)")
    p.add_argument("--image-size", type=int, default=64, help="flair: pixels a side")
    p.add_argument("--sentences", type=int, default=10)
    p.add_argument("--shards", type=int, default=35)
    p.add_argument("--data-dir", default="/tmp/fedray-prep")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--score", action="store_true",
                   help="also score a linear model on the sampled and the whole test set")
    a = p.parse_args()
    users = a.users or {"stackoverflow": 342_477, "femnist": 3_550, "flair": 41_131}[a.dataset]
    root = os.path.join(a.data_dir, f"{a.dataset}-{users}")
    t = time.perf_counter()
    if a.dataset == "stackoverflow":
        write_stackoverflow(root, users, a.sentences)
    elif a.dataset == "flair":
        write_flair(root, users, a.image_size)
    else:
        write_femnist(root, users, a.shards)
    written = time.perf_counter() - t
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    cache = os.path.join(a.data_dir, f"cache-{a.dataset}-{users}")
    shutil.rmtree(cache, ignore_errors=True)
    first = build(overrides(a.dataset, root, cache, users))
    second = build(overrides(a.dataset, root, cache, users))
    result = {"dataset": a.dataset, "users": users, "files_gb": size / 1e9,
              "generate_seconds": written, "first": first, "second": second,
              "cores": os.cpu_count(),
              "targets": {"first_seconds": 60, "peak_summed_rss_gb": 2, "second_seconds": 1}}
    if a.score:
        args = overrides(a.dataset, root, cache, users)
        result["score"] = {which: build(args, SCORE, which) for which in ("sample", "all")}
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
