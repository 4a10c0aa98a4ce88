"""Hugging Face dataset ids (Flower Datasets' ``flwrlabs/femnist``, ``flwrlabs/shakespeare``,
``sentiment140``, ...) resolved from the local Hugging Face hub cache, never downloaded
unless ``data.download=true`` (issue #31).

The hub cache is the one ``huggingface_hub`` and ``datasets.load_dataset`` fill (what a
Flower Datasets user already has on disk): ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``; a dataset lives in ``datasets--{owner}--{name}/``, its
revision ``refs/{revision}`` names a commit, and ``snapshots/{commit}/`` holds the repository's
files as links into the folder's ``blobs/``. ``data.hf_split``'s files are the snapshot's
Parquet files named ``{split}-*.parquet`` or ``{split}.parquet``, or whose own directory is
named ``{split}`` (the hub's ``data/train-00000-of-00001.parquet`` layout, and the
``{config}/train/0000.parquet`` one of the hub's Parquet conversion,
``data.hf_revision=refs/convert/parquet``); files of several configurations (top-level
folders) need ``data.hf_config`` to pick one. Every file must
resolve inside the dataset's folder: a link out of it is refused.
"""

from __future__ import annotations

import os
import re

from fedray.core.outputs import resolves_inside
from fedray.core.spec import ConfigError

NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,95}", re.ASCII)
ID = re.compile(rf"(?:{NAME.pattern}/)?{NAME.pattern}", re.ASCII)
REF = re.compile(rf"{NAME.pattern}(?:/{NAME.pattern}){{0,3}}", re.ASCII)


def check_names(repo_id: str, split: str, revision: str, config: str | None = None) -> None:
    """The id, split, revision and config as names (ASCII letters, digits, '-', '_', '.';
    no ``..``; '/' only between an id's owner and name and between a ref's parts): they
    become path components of the cache. ``--`` is refused in ids (the cache folder joins
    owner and name with it)."""
    if not ID.fullmatch(repo_id) or ".." in repo_id or "--" in repo_id:
        raise ConfigError("data.hf_id", repo_id, "a Hugging Face dataset id: owner/name or name "
                                                 "(ASCII letters, digits, '-', '_', '.')")
    for key, value, rule in (("data.hf_split", split, NAME),
                             ("data.hf_revision", revision, REF),
                             ("data.hf_config", config, NAME)):
        if value is not None and (not rule.fullmatch(value) or ".." in value):
            raise ConfigError(key, value, "a plain name (ASCII letters, digits, '-', '_', '.'"
                                          + (", parts joined by '/')" if rule is REF else ")"))


def cache_dirs() -> list[str]:
    """Where the hub cache may be, the one ``huggingface_hub`` uses first (``HF_HUB_CACHE``,
    its old name ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/
    hub``, ``~/.cache/huggingface/hub``), then the others that exist."""
    env = os.environ
    out = [env.get("HF_HUB_CACHE"), env.get("HUGGINGFACE_HUB_CACHE"),
           os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None,
           os.path.join(env["XDG_CACHE_HOME"], "huggingface", "hub")
           if env.get("XDG_CACHE_HOME") else None,
           os.path.join("~", ".cache", "huggingface", "hub")]
    return list(dict.fromkeys(os.path.abspath(os.path.expanduser(p)) for p in out if p))


def _snapshot(folder: str, revision: str) -> str | None:
    """The snapshot directory of ``revision`` (a ref or a commit) in a dataset's folder."""
    ref = os.path.join(folder, "refs", revision)
    commit = revision
    if os.path.isfile(ref):
        if not resolves_inside(ref, folder):
            raise ConfigError("data.hf_revision", revision, f"a ref inside {folder}")
        with open(ref, encoding="utf-8", errors="replace") as f:
            commit = f.read(200).strip()
        if not NAME.fullmatch(commit):
            raise ConfigError("data.hf_revision", revision, f"a ref naming a commit ({ref} "
                                                            f"does not)")
    snap = os.path.join(folder, "snapshots", commit)
    return snap if os.path.isdir(snap) else None


def _in_split(rel: str, split: str, config: str | None) -> bool:
    parts = rel.split(os.sep)
    base = parts[-1]
    if config is not None and (len(parts) < 2 or parts[0] != config):
        return False
    return base.endswith(".parquet") and (
        base == f"{split}.parquet" or base.startswith(f"{split}-")
        or (len(parts) > 1 and parts[-2] == split))


def split_files(repo_id: str, split: str = "train", revision: str = "main",
                download: bool = False, config: str | None = None) -> list[str]:
    """The Parquet files of ``split`` (of configuration ``config``) of the dataset
    ``repo_id`` in the hub cache, sorted; fetched into the first cache directory when
    ``download`` and no cache holds them. A :class:`ConfigError` names what is missing
    and how to get it."""
    check_names(repo_id, split, revision, config)
    folder_name = "datasets--" + repo_id.replace("/", "--")
    searched = cache_dirs()
    for top in searched:
        folder = os.path.join(top, folder_name)
        snap = _snapshot(folder, revision) if os.path.isdir(folder) else None
        if snap is not None:
            files = _files(folder, snap, repo_id, split, config)
            if files:
                return files
    if not download:
        raise ConfigError("data.hf_id", repo_id,
                          f"a dataset with split {split!r} in the local Hugging Face hub "
                          f"cache at revision {revision!r} (looked in {', '.join(searched)}); "
                          f"fetch it once with data.download=true, or point data.dataset=hf's "
                          f"data.root at a save_to_disk directory")
    folder, snap = _download(repo_id, revision, split, searched[0])
    files = _files(folder, snap, repo_id, split, config)
    if not files:
        raise ConfigError("data.hf_split", split,
                          f"a split with Parquet files in {repo_id} ({split}-*.parquet, "
                          f"{split}.parquet or {split}/*.parquet)")
    return files


def _files(folder: str, snap: str, repo_id: str, split: str, config: str | None
           ) -> list[str]:
    files = []
    for dirpath, _, names in os.walk(snap):
        for name in names:
            path = os.path.join(dirpath, name)
            if _in_split(os.path.relpath(path, snap), split, config):
                if not resolves_inside(path, folder):
                    raise ConfigError("data.hf_id", repo_id,
                                      f"cached files inside {folder} ({path} is a link to "
                                      f"{os.path.realpath(path)})")
                files.append(path)
    tops = sorted({os.path.relpath(f, snap).split(os.sep)[0] for f in files
                   if os.sep in os.path.relpath(f, snap)})
    if config is None and len(tops) > 1:
        raise ConfigError("data.hf_config", None, f"one of {', '.join(tops)}: {repo_id}'s "
                                                  f"split {split!r} has files in each")
    return sorted(files)


def _download(repo_id: str, revision: str, split: str, cache_dir: str) -> tuple[str, str]:
    """Fetch the Parquet files of ``split`` with ``huggingface_hub`` (only with
    ``data.download=true``, when the config is loaded); (its folder, its snapshot)."""
    patterns = [f"{split}-*.parquet", f"{split}.parquet", f"{split}/*.parquet",
                f"*/{split}-*.parquet", f"*/{split}.parquet", f"*/{split}/*.parquet"]
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                 cache_dir=cache_dir, allow_patterns=patterns)
    except Exception as e:  # noqa: BLE001 — network, auth, offline mode: one line
        reason = " ".join(str(e).split())[:200]
        raise ConfigError("data.download", True,
                          f"a reachable Hugging Face hub for {repo_id} ({type(e).__name__}: "
                          f"{reason})") from None
    return os.path.join(cache_dir, "datasets--" + repo_id.replace("/", "--")), snap
