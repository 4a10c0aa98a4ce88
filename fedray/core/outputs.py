"""Files a command writes into one local output directory (``fedray report``, ``compare``,
``fleet example``, ``fleet import-fedscale``, ``pretrain``, jobs): all or nothing.

- An existing file of the set is never replaced without ``overwrite`` (one
  :class:`ConfigError` naming it, before anything is written).
- A name that is a symbolic link or a directory is refused even with ``overwrite``: a
  planted ``report/index.md -> /etc/passwd`` is never written through.
- Each file is written to a temp file next to its target and renamed into place only when
  the whole set was written; after a failure no temp file is left and no target changed,
  and a directory the set created is removed again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any

from fedray.core.spec import ConfigError
from fedray.core.storage import first_link, open_new

OVERWRITE_HINT = "a new file (pass --overwrite to replace it)"


def resolves_inside(path: str, root: str) -> bool:
    """``path``, links resolved, lies strictly inside the directory ``root`` (links
    resolved): how a reader confines the files a dataset directory or cache names."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, top]) == top and real != top


def refuse_links(root: str, rel: str, field: str) -> str:
    """``root/rel`` after checking that ``rel`` is a plain relative path (no ``..``, not
    absolute) and that no existing component below ``root`` is a symbolic link; the root
    itself is the user's choice and may be one. Returns the joined path."""
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if os.path.isabs(rel) or ".." in parts:
        raise ConfigError(field, rel, f"a path inside {root} (no '..', not absolute)")
    link = first_link(root, parts)
    if link is not None:
        raise ConfigError(field, link, f"a real file or directory inside {root}, not a "
                                       f"symbolic link (fedray never writes, reads or "
                                       f"deletes through a link)")
    return os.path.join(root, *parts)


class OutputFiles:
    """``with OutputFiles(out_dir, names, overwrite) as out:`` then ``out.write_bytes(name,
    data)``/``out.write_text(name, text)`` or ``out.open(name, "w")``; every name is
    committed on a clean exit, none on an exception. ``names`` are relative (sub-folders
    allowed) and declared up front so the overwrite check comes before any work."""

    def __init__(self, out_dir: str, names: list[str], overwrite: bool = False,
                 field: str = "--out"):
        self.root, self.field, self.overwrite = os.path.abspath(out_dir), field, overwrite
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(field, out_dir, "a directory (this is a file)")
        self.targets = {n: refuse_links(self.root, n, field) for n in names}
        for path in self.targets.values():
            if os.path.isdir(path):
                raise ConfigError(field, path, "a file name (this is a directory)")
            if os.path.exists(path) and not overwrite:
                raise ConfigError(field, path, OVERWRITE_HINT)
        self._temps: dict[str, str] = {}
        self._created: list[str] = []

    def __enter__(self) -> OutputFiles:
        self._mkdirs(self.root)
        return self

    def _mkdirs(self, folder: str) -> None:
        missing = []
        while not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except OSError as e:
                raise ConfigError(self.field, d, f"a directory fedray can create "
                                                 f"({e.strerror})") from None
            self._created.append(d)

    def temp(self, name: str) -> str:
        """The temp path to write ``name`` to (committed on a clean exit)."""
        if name not in self.targets:
            raise KeyError(f"{name}: not declared in this OutputFiles")
        target = self.targets[name]
        self._mkdirs(os.path.dirname(target))
        tmp = f"{target}.tmp-{os.getpid()}"
        self._temps[name] = tmp
        return tmp

    def open(self, name: str, mode: str = "wb", **kwargs: Any) -> IO[Any]:
        """``name``'s temp file, created by this call (never through a planted link), open
        for writing in ``mode`` (``kwargs`` as for :func:`open`)."""
        return open_new(self.temp(name), mode, **kwargs)

    def write_bytes(self, name: str, data: bytes) -> str:
        with self.open(name) as f:
            f.write(data)
        return self.targets[name]

    def write_text(self, name: str, text: str) -> str:
        return self.write_bytes(name, text.encode())

    def path(self, name: str) -> str:
        """Where ``name`` lands once committed."""
        return self.targets[name]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            for name, tmp in self._temps.items():
                os.replace(tmp, self.targets[name])
            return
        for tmp in self._temps.values():
            if os.path.lexists(tmp):
                os.remove(tmp)
        for d in reversed(self._created):
            try:
                os.rmdir(d)
            except OSError:
                pass


@contextlib.contextmanager
def staged_dir(out_dir: str, overwrite: bool = False, field: str = "--out") -> Iterator[str]:
    """For a command whose file names are known only as it writes them (a report's plots):
    yields a fresh staging directory next to ``out_dir``; on a clean exit its files replace
    those of ``out_dir`` (``os.replace``: a link among them is replaced, never written
    through), on an exception the staging directory goes and ``out_dir`` is as it was.
    An ``out_dir`` that already holds files needs ``overwrite``; one that is a link is the
    caller's to refuse (:func:`refuse_links`) when fedray derived it."""
    import shutil
    import tempfile

    root = os.path.abspath(out_dir)
    if os.path.exists(root) and not os.path.isdir(root):
        raise ConfigError(field, out_dir, "a directory (this is a file)")
    if os.path.isdir(root) and os.listdir(root) and not overwrite:
        raise ConfigError(field, out_dir, "a new or empty directory (pass --overwrite to "
                                          "replace the files it holds)")
    parent = os.path.dirname(root)
    try:
        os.makedirs(parent, exist_ok=True)
        stage = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.tmp-", dir=parent)
    except OSError as e:
        raise ConfigError(field, out_dir, f"a directory fedray can create ({e.strerror})") \
            from None
    try:
        yield stage
        if not os.path.isdir(root):
            os.rename(stage, root)
            return
        for name in sorted(os.listdir(stage)):
            target = os.path.join(root, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            os.replace(os.path.join(stage, name), target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


__all__ = ["OVERWRITE_HINT", "OutputFiles", "refuse_links", "staged_dir"]
