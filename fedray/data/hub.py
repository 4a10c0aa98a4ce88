"""Hugging Face dataset ids (Flower Datasets' ``flwrlabs/femnist``, ``flwrlabs/shakespeare``,
``sentiment140``, ...) resolved from the local Hugging Face hub cache, never downloaded
unless ``data.download=true`` (issue #31).

The hub cache is the one ``huggingface_hub`` and ``datasets.load_dataset`` fill (what a
Flower Datasets user already has on disk): ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``; a dataset lives in ``datasets--{owner}--{name}/``, its
revision ``refs/{revision}`` names a commit, and ``snapshots/{commit}/`` holds the repository's
files as links into the folder's ``blobs/``. ``data.hf_split``'s files are the snapshot's
Parquet files whose name is ``{split}-*.parquet`` or ``{split}.parquet``, or that lie under a
directory named ``{split}`` (the hub's ``data/train-00000-of-00001.parquet`` and
``{config}/train/0000.parquet`` layouts). Every file must resolve inside the dataset's
folder: a link out of it is refused.
"""

from __future__ import annotations

import os
import re

from fedray.core.spec import ConfigError

ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
NAME = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}$")


def check_names(repo_id: str, split: str, revision: str) -> None:
    """The id, split and revision as names (no path separators beyond the one of
    ``owner/name``, no ``..``): they become path components of the cache."""
    if not ID.match(repo_id) or ".." in repo_id:
        raise ConfigError("data.hf_id", repo_id, "a Hugging Face dataset id: owner/name or name "
                                                 "(letters, digits, '-', '_', '.')")
    for key, value in (("data.hf_split", split), ("data.hf_revision", revision)):
        if not NAME.match(value) or ".." in value:
            raise ConfigError(key, value, "a plain name (letters, digits, '-', '_', '.')")


def cache_dirs() -> list[str]:
    """Where the hub cache may be, in the order ``huggingface_hub`` looks."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        out.append(os.path.join(os.environ["HF_HOME"], "hub"))
    out.append(os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub"))
    return list(dict.fromkeys(os.path.abspath(p) for p in out))


def _inside(path: str, root: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, top]) == top and real != top


def _snapshot(folder: str, revision: str) -> str | None:
    """The snapshot directory of ``revision`` (a ref or a commit) in a dataset's folder."""
    ref = os.path.join(folder, "refs", revision)
    commit = revision
    if os.path.isfile(ref):
        if not _inside(ref, folder):
            raise ConfigError("data.hf_revision", revision, f"a ref inside {folder}")
        with open(ref, encoding="utf-8", errors="replace") as f:
            commit = f.read(200).strip()
        if not NAME.match(commit):
            raise ConfigError("data.hf_revision", revision, f"a ref naming a commit ({ref} "
                                                            f"does not)")
    snap = os.path.join(folder, "snapshots", commit)
    return snap if os.path.isdir(snap) else None


def _in_split(rel: str, split: str) -> bool:
    parts = rel.split(os.sep)
    base = parts[-1]
    return base.endswith(".parquet") and (
        base == f"{split}.parquet" or base.startswith(f"{split}-") or split in parts[:-1])


def split_files(repo_id: str, split: str = "train", revision: str = "main",
                download: bool = False) -> list[str]:
    """The Parquet files of ``split`` of the dataset ``repo_id`` in the hub cache, sorted;
    fetched into the first cache directory first when ``download`` and not cached. A
    :class:`ConfigError` names what is missing and how to get it."""
    check_names(repo_id, split, revision)
    folder_name = "datasets--" + repo_id.replace("/", "--")
    searched = cache_dirs()
    for top in searched:
        folder = os.path.join(top, folder_name)
        if os.path.isdir(folder):
            snap = _snapshot(folder, revision)
            if snap is not None:
                return _files(folder, snap, repo_id, split)
    if not download:
        raise ConfigError("data.hf_id", repo_id,
                          f"a dataset in the local Hugging Face hub cache at revision "
                          f"{revision!r} (looked in {', '.join(searched)}); fetch it once "
                          f"with data.download=true, or point data.dataset=hf's data.root at "
                          f"a save_to_disk directory")
    return _files(*_download(repo_id, revision, searched[0]), repo_id, split)


def _files(folder: str, snap: str, repo_id: str, split: str) -> list[str]:
    files = []
    for dirpath, _, names in os.walk(snap):
        for name in names:
            path = os.path.join(dirpath, name)
            if _in_split(os.path.relpath(path, snap), split):
                if not _inside(path, folder):
                    raise ConfigError("data.hf_id", repo_id,
                                      f"cached files inside {folder} ({path} is a link to "
                                      f"{os.path.realpath(path)})")
                files.append(path)
    if not files:
        raise ConfigError("data.hf_split", split,
                          f"a split with Parquet files in {repo_id}'s snapshot {snap} "
                          f"({split}-*.parquet, {split}.parquet or {split}/*.parquet)")
    return sorted(files)


def _download(repo_id: str, revision: str, cache_dir: str) -> tuple[str, str]:
    """Fetch the dataset's Parquet files with ``huggingface_hub`` (only with
    ``data.download=true``); (its folder, its snapshot)."""
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                 cache_dir=cache_dir, allow_patterns=["*.parquet",
                                                                      "**/*.parquet"])
    except Exception as e:  # noqa: BLE001 — network, auth, offline mode: one line
        reason = " ".join(str(e).split())[:200]
        raise ConfigError("data.download", True,
                          f"a reachable Hugging Face hub for {repo_id} ({type(e).__name__}: "
                          f"{reason})") from None
    return os.path.join(cache_dir, "datasets--" + repo_id.replace("/", "--")), snap
