"""Central pretraining of the shared base that fine-tuning methods (FLITE and its
baselines) start from — ``fedray pretrain CONFIG``.

The FLITE paper's recipe (§4): SGD, momentum 0.9, lr 0.05 with a linear warmup over
``warmup_epochs`` (3) then cosine decay to 0, weight decay 5e-4, batch 128; the classifier
head frozen from initialisation (orthogonal by default, §3.5). Optionally only some classes
(``pretrain.classes``) or a share of the data (``pretrain.fraction``) are used, so that a
small study can pretrain on part of the data and fine-tune federatedly on the rest.
``pretrain.augment`` adds the paper's "standard crop+flip" (App. 0.C; random 4-pixel-padded
crop and horizontal flip per image, :func:`fedray.models.training.random_crop_flip`), for images.

Every epoch writes a checkpoint (model, momentum buffers, epoch, history) to
``OUT/checkpoints``; ``--resume`` continues from the latest one to the same result as an
uninterrupted run (shuffles are drawn from (seed, epoch)). The result is ``OUT/base.npz``
(the state dict as numpy), ``OUT/base.json`` (model, head, classes, split seed, accuracy)
and ``OUT/samples.npz`` (the dataset ids of the samples it was trained on, which
:func:`check_base_split` compares with a run's test split before the run starts).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from fedray.core.config import ExperimentConfig
from fedray.core.seeding import rng, torch_generator, torch_seeded
from fedray.core.spec import ConfigError, shown
from fedray.core.storage import StateFileError, Storage, check_npz
from fedray.observe.metrics import json_text


def lr_at(step: int, steps_per_epoch: int, epochs: int, warmup_epochs: int, lr: float) -> float:
    """Linear warmup over ``warmup_epochs`` then cosine decay to 0 (per optimizer step)."""
    warm = warmup_epochs * steps_per_epoch
    total = epochs * steps_per_epoch
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * lr * (1.0 + math.cos(math.pi * min(1.0, progress)))


def select(y: np.ndarray, classes: list[int] | None, fraction: float, seed: int,
           purpose: str) -> np.ndarray:
    """Indices of the samples of ``classes`` (all when None), a seeded ``fraction`` of them."""
    idx = np.arange(len(y)) if classes is None else np.flatnonzero(np.isin(y, classes))
    if fraction < 1.0:
        keep = max(1, int(round(fraction * idx.size)))
        idx = np.sort(rng(seed, -1, -1, purpose).choice(idx, keep, replace=False))
    return idx


def build_base_model(cfg: ExperimentConfig, input_shape: tuple[int, ...], num_classes: int,
                     head: str | None = None):
    """The model with seeded initial weights and ``head`` (default: ``pretrain.head``)."""

    from fedray.models import build_configured
    from fedray.models.heads import configure_head

    with torch_seeded(cfg.seed, -1, -1, "model-init"):
        model = build_configured(cfg.model, input_shape, num_classes)
    return configure_head(model, head or cfg.pretrain.head, cfg.seed)


OUTPUTS = ("base.npz", "base.json", "samples.npz", "checkpoints")


def pretrain(cfg: ExperimentConfig, out: str, *, resume: bool = False,
             progress: bool = True, overwrite: bool = False,
             on_epoch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train the base centrally; returns base.json's content. ``on_epoch(history_row)`` is
    called after each epoch's checkpoint is written (progress reporting, e.g. to Tune);
    ``progress`` shows the epochs as one stage of :mod:`fedray.observe.progress` on stderr.
    ``out`` must be new or empty unless ``resume`` (continue its checkpoints) or
    ``overwrite`` (its base and checkpoints are replaced; nothing else there is touched).
    Runs with ``pretrain.threads`` torch threads (default torch's own), restored after."""
    import torch

    previous = torch.get_num_threads()
    threads = int(cfg.pretrain.threads) if cfg.pretrain.threads is not None else \
        max(1, previous)
    torch.set_num_threads(threads)
    try:
        return _pretrain(cfg, out, resume, progress, overwrite, on_epoch, threads)
    finally:
        torch.set_num_threads(previous)


def _pretrain(cfg: ExperimentConfig, out: str, resume: bool, progress: bool, overwrite: bool,
              on_epoch: Callable[[dict], None] | None, threads: int) -> dict[str, Any]:
    import torch

    from fedray.data import load_dataset
    from fedray.models.training import SGD, evaluate, get_state, set_state
    from fedray.observe.progress import Progress

    p = cfg.pretrain
    storage = Storage(out)
    if not resume and not storage.is_empty():
        if not overwrite:
            raise ConfigError("--out", out, "a new or empty directory (--resume continues "
                                            "the pretraining in it, --overwrite replaces "
                                            "its base)")
        for name in OUTPUTS:
            storage.delete(name)
    data = load_dataset(cfg.data, cfg.seed)
    tr, te = _subsets(cfg, data)
    x, y = data.x_train[tr], data.y_train[tr]
    if p.augment and x.ndim != 4:
        raise ConfigError("pretrain.augment", True, f"false for {cfg.data.dataset} (crop+flip "
                                                    f"needs images, got shape {x.shape[1:]})")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_base_model(cfg, data.input_shape, data.num_classes).to(device)
    params = [q for q in model.parameters() if q.requires_grad]
    opt = SGD(params, lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay)
    start, history = 0, []
    ck = storage.read_checkpoint() if resume else None
    if ck is not None:
        set_state(model, ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start, history = ck["epoch"], ck["history"]
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    with Progress(enabled=progress).stage("pretrain", total=p.epochs, unit="epochs") as stage:
        stage.report(start)
        for epoch in range(start, p.epochs):
            loss = _epoch(cfg, model, opt, xt, yt, epoch)
            ev = evaluate(model, data.x_test[te], data.y_test[te], device)
            history.append({"epoch": epoch + 1, "train_loss": loss,
                            "test_accuracy": ev["accuracy"], "test_loss": ev["loss"]})
            stage.report(epoch + 1, note=f"loss {loss:.4f} acc {ev['accuracy']:.4f}")
            storage.write_checkpoint(epoch + 1, {
                "epoch": epoch + 1, "model": get_state(model), "optimizer": opt.state_dict(),
                "history": history}, keep=3)
            if on_epoch is not None:
                on_epoch(history[-1])
    if data.train_ids is not None:  # the samples it saw, for check_base_split
        buf = io.BytesIO()
        np.savez(buf, train=np.asarray(data.train_ids[tr], np.int64))
        storage.write_bytes("samples.npz", buf.getvalue())
    split_seed = cfg.seed if cfg.data.split_seed is None else cfg.data.split_seed
    meta = {"model": cfg.model, "num_classes": data.num_classes,
            "input_shape": list(data.input_shape), "dataset": cfg.data.dataset,
            "split_seed": int(split_seed),
            "head": p.head, "classes": p.classes, "fraction": p.fraction,
            "epochs": p.epochs, "seed": cfg.seed, "train_samples": int(len(x)),
            "threads": threads,
            "test_accuracy": history[-1]["test_accuracy"] if history else None,
            "history": history}
    storage.write_bytes("base.json", json_text(meta, indent=2).encode())
    buf = io.BytesIO()
    np.savez(buf, **get_state(model))
    storage.write_bytes("base.npz", buf.getvalue())  # last: a base.npz means a whole base
    return meta


def _subsets(cfg: ExperimentConfig, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """The training and test samples the base sees: ``pretrain.classes`` (checked against
    the data set's classes), the training side cut to ``pretrain.fraction``."""
    p = cfg.pretrain
    if p.classes is not None:
        bad = [c for c in p.classes if not 0 <= c < data.num_classes]
        if bad:
            raise ConfigError("pretrain.classes", bad, f"class ids in 0..{data.num_classes - 1}")
    return (select(data.y_train, p.classes, p.fraction, cfg.seed, "pretrain-subset"),
            select(data.y_test, p.classes, 1.0, cfg.seed, "pretrain-test"))


def _epoch(cfg: ExperimentConfig, model: Any, opt: Any, xt: Any, yt: Any, epoch: int) -> float:
    """One epoch of SGD over (``xt``, ``yt``) in a permutation from (seed, epoch), the
    learning rate warmed up then cosine-decayed per step (:func:`lr_at`), crop+flip with
    ``pretrain.augment``; returns the mean training loss."""
    import torch

    from fedray.models.training import random_crop_flip

    p = cfg.pretrain
    steps = math.ceil(len(xt) / p.batch_size)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    perm = rng(cfg.seed, epoch, -1, "pretrain-shuffle").permutation(len(xt))
    total = 0.0
    aug = torch_generator(cfg.seed, epoch, -1, "pretrain-augment") \
        if p.augment and xt.dim() == 4 else None
    with torch_seeded(cfg.seed, epoch, -1, "pretrain-torch"):
        for b in range(steps):
            opt.lr = lr_at(epoch * steps + b, steps, p.epochs, p.warmup_epochs, p.lr)
            idx = perm[b * p.batch_size:(b + 1) * p.batch_size]
            opt.zero_grad()
            xb = xt[idx] if aug is None else random_crop_flip(xt[idx], aug)
            loss = loss_fn(model(xb), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach())
    return total / steps


def load_base(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(state dict as float32 numpy, metadata) of a base written by :func:`pretrain`;
    ``path`` is its directory (local or a pyarrow.fs URI)."""
    meta = load_base_meta(path)
    storage = Storage(path)
    state = _read_npz(storage, "base.npz", "a base `fedray pretrain` wrote")
    bad = next((k for k, v in state.items() if v.dtype.kind != "f"), None)
    if bad is not None:
        raise StateFileError(storage.path("base.npz"), f"float arrays as `fedray pretrain` "
                                                       f"writes ({shown(bad)!r} is "
                                                       f"{state[bad].dtype})")
    return state, meta


def load_base_meta(path: str) -> dict[str, Any]:
    """The metadata (``base.json``: the model's config and its head) of the base
    :func:`pretrain` wrote in directory ``path``, without reading its arrays: what a config
    check needs."""
    storage = Storage(path)
    if not storage.exists("base.npz"):
        raise ConfigError("algorithm.base", path,
                          "a directory written by `fedray pretrain` (holding base.npz)")
    meta = storage.read_json("base.json", "the JSON `fedray pretrain` wrote")
    heads = ("orthogonal", "kaiming", "trainable")
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict) or \
            meta.get("head") not in heads:
        raise StateFileError(storage.path("base.json"), f"the JSON `fedray pretrain` writes: "
                                                        f"an object with the base's model "
                                                        f"(a mapping) and its head (one of "
                                                        f"{', '.join(heads)})")
    return meta


def check_base_state(base: str | None, cfg: ExperimentConfig, data: Any) -> None:
    """Refuse, before Ray starts, a base whose arrays are not the configured model's on
    this data (every entry of its state dict, of the same shape), which would otherwise
    fail inside every executor."""
    if base is None:
        return
    state, _ = load_base(base)
    want = build_base_model(cfg, data.input_shape, data.num_classes).state_dict()
    for key in sorted(want):
        if key not in state:
            raise ConfigError("algorithm.base", base, f"a base of this run's model on this "
                                                      f"data (it lacks {shown(key)!r})")
        if tuple(state[key].shape) != tuple(want[key].shape):
            raise ConfigError("algorithm.base", base, f"a base of this run's model on this "
                                                      f"data ({shown(key)!r} is "
                                                      f"{tuple(state[key].shape)}, the "
                                                      f"model's {tuple(want[key].shape)})")


def _read_npz(storage: Storage, name: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of ``name`` in ``storage`` (no pickle), or a :class:`StateFileError`
    saying it is not ``what``."""
    data = storage.read_bytes(name)
    try:
        check_npz(data, storage.path(name))
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (ValueError, OSError, KeyError, RecursionError, zipfile.BadZipFile) as e:
        if isinstance(e, StateFileError):
            raise
        raise StateFileError(storage.path(name), f"{what} ({type(e).__name__})") from None


def base_samples(path: str) -> np.ndarray | None:
    """The dataset ids a base was pretrained on (None: a base written before they were
    recorded)."""
    storage = Storage(path)
    if not storage.exists("samples.npz"):
        return None
    arrays = _read_npz(storage, "samples.npz", "the sample ids `fedray pretrain` wrote")
    if "train" not in arrays:
        raise StateFileError(storage.path("samples.npz"), "a 1-D integer array 'train'")
    ids = np.asarray(arrays["train"])
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise StateFileError(storage.path("samples.npz"), "a 1-D integer array 'train'")
    return ids.astype(np.int64)


def evaluated_ids(cfg: ExperimentConfig, data: Any, part: str = "all") -> np.ndarray | None:
    """The dataset ids of the samples a run reports a test score on: the global test set
    (``eval.global_test``; ``part="global"``) and the clients' local test splits where they
    are scored (``eval.clients`` not none, ``eval.local_before_after``,
    ``eval.finetune_epochs``; ``part="local"``). None where the data does not number its
    samples (a population read by natural id, a loader without ids)."""
    test_ids = getattr(data, "test_ids", None)
    train_ids = getattr(data, "train_ids", None)
    if test_ids is None or train_ids is None:
        return None
    parts = [np.asarray(test_ids)] if cfg.eval.global_test and part != "local" else []
    if part != "global" and local_scored(cfg):
        local = [np.asarray(t) for t in data.test_idx if len(t)]
        if local:
            parts.append(np.asarray(train_ids)[np.concatenate(local)])
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def local_scored(cfg: ExperimentConfig) -> bool:
    e = cfg.eval
    return e.clients != "none" or e.local_before_after or bool(e.finetune_epochs)


def _base_meta(base: str) -> dict:
    return Storage(base).read_json("base.json", "the JSON `fedray pretrain` wrote")


def seen_samples(base: str, meta: dict, cfg: ExperimentConfig) -> np.ndarray | None:
    """The ids the base was pretrained on: its ``samples.npz``, or, for a base written before
    it was recorded, the same selection replayed from ``base.json`` (split seed = its seed,
    then ``pretrain.classes`` / ``fraction`` drawn from that seed, as :func:`pretrain` does).
    None when the dataset does not number its samples."""
    seen = base_samples(base)
    if seen is not None:
        return seen
    import dataclasses

    from fedray.data import load_dataset

    try:
        seed, fraction = int(meta["seed"]), float(meta.get("fraction", 1.0))
    except (KeyError, TypeError, ValueError):
        raise ConfigError("algorithm.base", base,
                          "a base whose base.json records its seed (run `fedray pretrain` "
                          "again)") from None
    ds = load_dataset(dataclasses.replace(cfg.data, split_seed=seed), seed)
    if ds.train_ids is None:
        return None
    return ds.train_ids[select(ds.y_train, meta.get("classes"), fraction, seed,
                               "pretrain-subset")]


def _seen_by_base(base: str, cfg: ExperimentConfig) -> tuple[dict, np.ndarray] | None:
    """(base.json, the ids the base trained on) when the base was pretrained on this run's
    dataset and its samples are numbered; None otherwise (nothing to compare)."""
    meta = _base_meta(base)
    if meta.get("dataset") != cfg.data.dataset:
        return None
    seen = seen_samples(base, meta, cfg)
    return None if seen is None else (meta, seen)


def unseen_local_tests(base: str | None, cfg: ExperimentConfig, data: Any) -> Any:
    """``data`` with every client's local test split cut to the samples the base was not
    pretrained on (a client left without any is not scored). The clients' shards come from
    the train split, part of which pretrained the base; their local *training* splits are
    kept as drawn (training on pretraining data is fine), only what is scored changes; the
    cut sizes are ``test_sizes`` of the run's data summary."""
    import dataclasses

    if base is None or getattr(data, "train_ids", None) is None or \
            not hasattr(data, "test_idx"):
        return data
    try:
        found = _seen_by_base(base, cfg)
    except (StateFileError, OSError):
        return data  # check_base / check_base_split name the problem
    if found is None:
        return data
    seen = found[1]
    ids = np.asarray(data.train_ids)
    tests = [np.asarray(t)[~np.isin(ids[np.asarray(t, np.int64)], seen)]
             for t in data.test_idx]
    return dataclasses.replace(data, test_idx=tests)


def check_base_split(base: str | None, cfg: ExperimentConfig, data: Any) -> None:
    """Refuse, before Ray starts, a run that would score a base on samples it was pretrained
    on: the base's training ids (:func:`seen_samples`) must be disjoint from every id
    :func:`evaluated_ids` lists. The method's data already cuts the local test splits to
    unseen samples (:func:`unseen_local_tests`), so the global test set decides, unless data
    built another way is passed in; a run that scores local splits the cut left empty is
    refused too. A base pretrained on another dataset passes.

    Why: the FLITE and DP studies once pretrained on the seed-0 split while each run's test
    split followed its own seed, so seeds 1 and 2 were tested partly on training images."""
    if base is None or getattr(data, "test_ids", None) is None or \
            getattr(data, "train_ids", None) is None:
        return
    found = _seen_by_base(base, cfg)
    if found is None:
        return
    meta, seen = found
    split = cfg.seed if cfg.data.split_seed is None else cfg.data.split_seed
    was = meta.get("split_seed", meta.get("seed"))
    where = {"global": f"the run's global test set (base split seed {was}, this run's "
                       f"{split}); pretrain with the run's seed, or set data.split_seed={was} "
                       f"here",
             "local": "the clients' local test splits (data built without the method's "
                      "build_data, which cuts them)"}
    for part, text in where.items():
        leaked = np.intersect1d(seen, evaluated_ids(cfg, data, part))
        if len(leaked):
            raise ConfigError(
                "algorithm.base", base,
                f"a base pretrained on none of the samples this run tests on: {len(leaked)} "
                f"of its {len(seen)} training samples are in {text}")
    if local_scored(cfg) and hasattr(data, "test_idx") and \
            not any(len(t) for t in data.test_idx):
        raise ConfigError(
            "eval.clients", cfg.eval.clients,
            "none, scoring the global test set only (or pretrain on part of the train split, "
            "pretrain.fraction < 1): the base was pretrained on every sample of the clients' "
            "local test splits, so none is left to score them on")
