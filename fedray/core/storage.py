"""Run-directory I/O through ``pyarrow.fs``: a local path or a URI (``s3://``, ``gs://``,
``hdfs://``) behaves the same, so a cluster can point runs and client state at shared
object storage.

A run directory is data, never code: nothing read back from it is unpickled. Nested state
(checkpoints, client states) is stored by :func:`pack_state` as an ``.npz`` whose arrays
are read with ``allow_pickle=False`` and whose structure is a JSON skeleton naming them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import zipfile
from typing import Any, NamedTuple

import numpy as np
import pyarrow.fs as pafs

from fedray.core.spec import redact

TREE = "__tree__"
LATEST_LINE = re.compile(r"(\d{1,9}) ([0-9a-f]{64})")  # "INDEX SHA256" in FOLDER/LATEST


LINK_RULE = ("a symbolic link inside a run directory; fedray never reads, writes or deletes "
             "through one (replace it with the real file or directory)")


class Checkpoint(NamedTuple):
    """A checkpoint read back: its index (``FOLDER/INDEX.npz``), its path and its state."""

    index: int
    path: str
    state: Any


class StateFileError(ValueError):
    """A state file that is not what fedray writes (damaged, foreign, or a pickle)."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(redact(f"{name}: {reason}"))

    def __reduce__(self):
        return StateFileError, (self.name, self.reason)


def _encode(obj: Any, arrays: list[np.ndarray], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"{where}: object arrays cannot be stored")
        arrays.append(arr)
        return {"$np": len(arrays) - 1, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, arrays, f"{where}.{k}") for k, v in obj.items()}
        return {"$dict": [[_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")]
                          for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise TypeError(f"{where}: cannot store a {type(obj).__name__} (allowed: None, bool, int, "
                    f"float, str, numpy arrays and scalars, dict, list, tuple)")


def _decode(node: Any, arrays: Any, name: str) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays, name) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) in (1, 2) and "$np" in node:
        key = f"a{int(node['$np'])}"
        if key not in arrays:
            raise StateFileError(name, f"the skeleton names array {key}, which is missing")
        arr = arrays[key]
        return arr[()] if node.get("scalar") else arr
    if len(node) == 1 and "$dict" in node:
        return {_decode(k, arrays, name): _decode(v, arrays, name) for k, v in node["$dict"]}
    if len(node) == 1 and "$tuple" in node:
        return tuple(_decode(v, arrays, name) for v in node["$tuple"])
    return {k: _decode(v, arrays, name) for k, v in node.items()}


# (what pyarrow's message says, the fact kept from it) for read_error
_READ_FACTS = [
    (r"Expected (\d+) columns, got (\d+)",
     lambda m: f"a row has {m.group(2)} columns where the header has {m.group(1)}"),
    (r"CSV column #(\d+)", lambda m: f"column {int(m.group(1)) + 1}"),
    (r"Row #(\d+)", lambda m: f"row {m.group(1)}"),
    (r"conversion error to (\w+)", lambda m: f"not a valid {m.group(1)}"),
]


def read_error(e: BaseException) -> str:
    """Why pyarrow could not read a table file (a trace, a CSV), without the file's
    content: its messages quote the offending row ("Expected 4 columns, got 2: <the
    row>"), which for a path pointing at another file (a link to /etc/passwd) would print
    that file. Only counts, numbers and type names are kept."""
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8 text"
    text = str(e)
    facts = [say(m) for pattern, say in _READ_FACTS if (m := re.search(pattern, text))]
    if "magic bytes" in text or "Parquet file size" in text:
        facts.append("not a Parquet file")
    if not facts and isinstance(e, OSError) and e.strerror:
        facts.append(e.strerror)
    return ", ".join(facts) or f"pyarrow could not parse it: {type(e).__name__}"


def open_new(path: str, mode: str = "wb", **kwargs: Any) -> Any:
    """``path`` opened for writing as a file this call creates (``O_CREAT | O_EXCL |
    O_NOFOLLOW``): the one way fedray opens a temp file before its rename. A file or a
    symbolic link planted at that name is removed (the link itself, never its target) and
    the name created again; one planted again in between fails the write, so nothing is
    ever written through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except FileExistsError:
        os.unlink(path)  # a stale temp file of a dead process, or a planted link
        fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, mode, **kwargs)


def read_marker(path: str | os.PathLike) -> dict | None:
    """A local JSON marker (cache keys), or None when it is missing or unreadable — a
    truncated marker is a cache miss, not an error that blocks every later run."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(path: str | os.PathLike, data: dict) -> None:
    """``data`` as JSON at ``path``, atomically (temp file + rename)."""
    path = os.fspath(path)
    Storage(os.path.dirname(os.path.abspath(path))).write_bytes(
        os.path.basename(path), json.dumps(data, allow_nan=False).encode())


def pack_state(obj: Any) -> bytes:
    """``obj`` (None/bool/int/float/str, numpy arrays and scalars, dicts with any such keys,
    lists, tuples) as ``.npz`` bytes: its arrays plus a JSON skeleton. Round-trips exactly
    (dtypes, shapes, key types, NaN)."""
    arrays: list[np.ndarray] = []
    tree = json.dumps(_encode(obj, arrays, "state"), allow_nan=True)
    buf = io.BytesIO()
    np.savez(buf, **{TREE: np.frombuffer(tree.encode(), np.uint8)},
             **{f"a{i}": a for i, a in enumerate(arrays)})
    return buf.getvalue()


MAX_TREE_BYTES = 64 << 20


def check_npz(data: bytes, name: str) -> None:
    """Each member's ``.npy`` header against the bytes it occupies, before numpy allocates
    anything: :func:`pack_state` stores members uncompressed, so the declared shape x
    itemsize must be exactly what follows the header. A header declaring a huge array, a
    compressed member (a zip bomb) or an object dtype is refused with its member named."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise StateFileError(name, f"not a readable .npz ({e})") from None
    with zf:
        for info in zf.infolist():
            where = f"member {info.filename}"
            if info.compress_type != zipfile.ZIP_STORED:
                raise StateFileError(name, f"{where} is compressed; fedray stores state "
                                           f"uncompressed")
            if info.file_size > len(data):
                raise StateFileError(name, f"{where} declares {info.file_size:,} bytes in a "
                                           f"file of {len(data):,}")
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)
                shape, _, dtype = reader(f, max_header_size=10_000)
                header = f.tell()
            if dtype.hasobject:
                raise StateFileError(name, f"{where} holds Python objects; fedray never "
                                           f"unpickles run-directory files")
            declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if declared != info.file_size - header:
                raise StateFileError(name, f"{where} declares shape {shape} of {dtype} "
                                           f"({declared:,} bytes) but holds "
                                           f"{info.file_size - header:,}")
            if info.filename == TREE + ".npy" and declared > MAX_TREE_BYTES:
                raise StateFileError(name, f"its skeleton is {declared:,} bytes (at most "
                                           f"{MAX_TREE_BYTES:,})")


def unpack_state(data: bytes, name: str = "state") -> Any:
    """The object :func:`pack_state` wrote; anything else — a pickle, object arrays, a
    damaged file — raises :class:`StateFileError` naming ``name``, and nothing is executed
    (``np.load(..., allow_pickle=False)``)."""
    if data[:1] == b"\x80":  # the PROTO opcode of every pickle since protocol 2
        raise StateFileError(name, "a Python pickle; fedray never unpickles run-directory files "
                                   "(unpickling runs code)")
    try:
        check_npz(data, name)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            if TREE not in npz.files:
                raise StateFileError(name, "not a fedray state file (no skeleton)")
            arrays = {k: npz[k] for k in npz.files if k != TREE}
            tree = json.loads(npz[TREE].tobytes().decode())
    except StateFileError:
        raise
    except (ValueError, OSError, EOFError, UnicodeDecodeError, KeyError,
            zipfile.BadZipFile) as e:
        raise StateFileError(name, f"not a readable fedray state file ({type(e).__name__}: "
                                   f"{str(e)[:200]})") from None
    except RecursionError:
        raise StateFileError(name, "its skeleton nests too deep") from None
    try:
        return _decode(tree, arrays, name)
    except RecursionError:
        raise StateFileError(name, "its skeleton nests too deep") from None
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        raise StateFileError(name, f"a damaged skeleton ({type(e).__name__})") from None


def first_link(root: str, parts: list[str]) -> str | None:
    """The first of ``root/parts[0]``, ``root/parts[0]/parts[1]``, ... that is a symbolic
    link (None when none is): the one check of every path fedray derives below a directory
    it was given — the root itself is the user's choice."""
    at = root
    for p in parts:
        at = os.path.join(at, p)
        if os.path.islink(at):
            return at
    return None


def _reason(e: OSError) -> str:
    return e.strerror or " ".join(str(e).split())[:160]


def absolute(path: str) -> str:
    """``path`` as another process must open it: a local path made absolute (the driver
    and the executors of a cluster the run joined work in their own directories), a URI
    (``s3://...``) unchanged. Config paths pass through this when the config is checked."""
    return path if "://" in path else os.path.abspath(path)


class Storage:
    """A directory on some filesystem; paths are relative to its root."""

    def __init__(self, uri: str):
        """Nothing is created until something is written (a ``--resume`` of a mistyped path
        must not leave an empty directory behind). Raises ValueError for a URI no pyarrow
        filesystem serves and for a path that is a file."""
        self.uri = uri
        if "://" in uri:
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(uri)
            except Exception as e:  # noqa: BLE001 — pyarrow raises ArrowInvalid/OSError/...
                raise ValueError(f"{uri}: not a filesystem pyarrow serves ({str(e)[:160]})") \
                    from None
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(uri)
        if self.fs.get_file_info(self.root).type == pafs.FileType.File:
            raise ValueError(f"{uri}: a file, not a directory")

    def is_empty(self) -> bool:
        """True when the directory does not exist or holds nothing."""
        return not self.listdir("")

    def __reduce__(self):
        return (Storage, (self.location,))

    @property
    def location(self) -> str:
        """What another process opens this directory with: a local directory's absolute
        path (a relative one would resolve against that process's working directory — a
        Ray worker of a cluster the run joined has its own), the URI otherwise."""
        return absolute(self.uri)

    def path(self, rel: str) -> str:
        """The full path of ``rel``, which stays inside the directory: a relative path
        without ``..``, and on a local disk no existing component below the root may be a
        symbolic link (a planted ``checkpoints -> /elsewhere`` is refused for reading,
        writing and deleting alike; the root itself is the user's choice)."""
        if not rel:
            return self.root
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "\\" in rel:
            raise StateFileError(f"{self.root}/{rel}", "a path inside the run directory "
                                                       "(no '..', not absolute)")
        link = first_link(self.root, parts) if self.is_local else None
        if link is not None:
            raise StateFileError(link, LINK_RULE)
        return f"{self.root}/{rel}"

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def check_no_links(self) -> None:
        """Refuse a local directory that holds a symbolic link anywhere below its root
        (fedray never makes one): checked before a run continues in it, so a planted link
        is an error before Ray starts, not after a round has run. A
        :class:`StateFileError` naming the first link."""
        if not self.is_local or not os.path.isdir(self.root):
            return
        for top, dirs, files in os.walk(self.root):
            for name in sorted(dirs + files):
                if os.path.islink(os.path.join(top, name)):
                    raise StateFileError(os.path.join(top, name), LINK_RULE)

    def write_bytes(self, rel: str, data: bytes, durable: bool = False) -> None:
        """Write atomically where the filesystem allows (temp file + move; the temp file is
        removed if the write fails). ``durable`` on a local disk: the file and its directory
        are fsynced, so the write survives a power loss, not only a crash."""
        target = self.path(rel)
        folder = target.rsplit("/", 1)[0]
        tmp = f"{target}.tmp-{os.getpid()}"
        try:
            self.fs.create_dir(folder, recursive=True)
        except OSError as e:
            raise StateFileError(folder, f"a directory fedray can create and write "
                                         f"({_reason(e)})") from None
        try:
            if self.is_local:
                with open_new(tmp) as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, target)
                if durable:
                    fd = os.open(folder, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            else:
                with self.fs.open_output_stream(tmp) as f:
                    f.write(data)
                self.fs.move(tmp, target)
        except BaseException as e:
            try:
                if self.fs.get_file_info(tmp).type == pafs.FileType.File:
                    self.fs.delete_file(tmp)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise StateFileError(target, f"a file fedray can write ({_reason(e)})") \
                    from None
            raise

    def read_json(self, rel: str, what: str = "the JSON object fedray writes") -> dict:
        """``rel`` as a JSON object, read as data: a missing, damaged or non-object file is
        a :class:`StateFileError` naming it and ``what`` it should be (the one JSON reader
        of run directories, bases and caches)."""
        try:
            data = json.loads(self.read_bytes(rel).decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise StateFileError(self.path(rel), f"{what} ({type(e).__name__})") from None
        if not isinstance(data, dict):
            raise StateFileError(self.path(rel), f"{what} (a JSON object)")
        return data

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def write_state(self, rel: str, obj: Any) -> int:
        """Nested state as a safe ``.npz`` (:func:`pack_state`); returns the bytes written."""
        data = pack_state(obj)
        self.write_bytes(rel, data)
        return len(data)

    def read_state(self, rel: str) -> Any:
        """What :meth:`write_state` wrote; never unpickles (:func:`unpack_state`)."""
        return unpack_state(self.read_bytes(rel), self.path(rel))

    def write_checkpoint(self, index: int, obj: Any, folder: str = "checkpoints",
                         keep: int = 2) -> None:
        """``obj`` as ``FOLDER/{index:06d}.npz`` (:func:`pack_state`), then ``FOLDER/LATEST``
        = one "INDEX SHA256" line per kept checkpoint, newest first; then all but the
        newest ``keep`` checkpoints and any temp file left by a killed writer go. On a local
        disk everything written before is flushed first (``os.sync``: the client states
        the checkpoint names) and the checkpoint and LATEST are fsynced."""
        if self.is_local:
            os.sync()
        data = pack_state(obj)
        self.write_bytes(f"{folder}/{index:06d}.npz", data, durable=True)
        digests = [f"{index} {hashlib.sha256(data).hexdigest()}"]
        digests += [line for line in self._latest_lines(folder)
                    if LATEST_LINE.fullmatch(line) and not line.startswith(f"{index} ")
                    ][:keep - 1]
        self.write_bytes(f"{folder}/LATEST", "\n".join(digests).encode(), durable=True)
        named = {f"{int(line.split()[0]):06d}.npz" for line in digests}
        for f in self.listdir(folder):
            if ".tmp-" in f or (f.endswith(".npz") and f not in named):
                self.delete(f"{folder}/{f}")

    def latest_index(self, folder: str = "checkpoints") -> int | None:
        """The index ``FOLDER/LATEST`` names first (the newest checkpoint), None when there
        is none or it is not one fedray wrote."""
        lines = self._latest_lines(folder)
        match = LATEST_LINE.fullmatch(lines[0]) if lines else None
        return int(match[1]) if match else None

    def _latest_lines(self, folder: str) -> list[str]:
        if not self.exists(f"{folder}/LATEST"):
            return []
        text = self.read_bytes(f"{folder}/LATEST")[:4096].decode(errors="replace")
        return [line.strip() for line in text.splitlines() if line.strip()]

    def read_checkpoint(self, folder: str = "checkpoints") -> Any | None:
        """The newest intact checkpoint ``FOLDER/LATEST`` names (None when there is none
        yet): :meth:`newest_checkpoint`'s state."""
        ck = self.newest_checkpoint(folder)
        return None if ck is None else ck.state

    def newest_checkpoint(self, folder: str = "checkpoints") -> Checkpoint | None:
        """The newest intact checkpoint ``FOLDER/LATEST`` names, with its index (None when
        there is none yet). A checkpoint is read as data only when its SHA-256 matches the
        one in ``LATEST`` (which is never used as a path); a damaged newest one is skipped
        for the next with a warning on stderr naming it; when none is intact the error
        names the newest."""
        latest = f"{folder}/LATEST"
        lines = self._latest_lines(folder)
        if not lines and not self.exists(latest):
            return None
        first: StateFileError | None = None
        for line in lines or [""]:
            try:
                obj = self._read_named(folder, line)
            except StateFileError as e:
                first = first or e
                continue
            index = int(line.split()[0])
            if first is not None:
                print(f"fedray: {first}; using the older checkpoint {folder}/"
                      f"{index:06d}.npz", file=sys.stderr, flush=True)
            return Checkpoint(index, self.path(f"{folder}/{index:06d}.npz"), obj)
        raise first  # type: ignore[misc]

    def _read_named(self, folder: str, line: str) -> Any:
        latest = f"{folder}/LATEST"
        match = LATEST_LINE.fullmatch(line)
        if match is None:
            raise StateFileError(self.path(latest), f"got {line[:80]!r}; allowed: "
                                                    f"'INDEX SHA256' lines as fedray writes")
        rel = f"{folder}/{int(match[1]):06d}.npz"
        if not self.exists(rel):
            raise StateFileError(self.path(rel), f"missing (named by {latest})")
        data = self.read_bytes(rel)
        if hashlib.sha256(data).hexdigest() != match[2]:
            raise StateFileError(self.path(rel), f"its SHA-256 differs from the one in "
                                                 f"{latest} (damaged or replaced)")
        return unpack_state(data, self.path(rel))

    def write_parquet(self, rel: str, table: Any) -> None:
        """A ``pyarrow.Table`` (or a list of row dicts) as one Parquet file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not isinstance(table, pa.Table):
            table = pa.Table.from_pylist(table)
        buf = io.BytesIO()
        # dictionary pages for text only: numeric columns (ids, bytes, losses) are mostly
        # distinct, and encoding them through a dictionary costs time and bytes
        text = [f.name for f in table.schema if pa.types.is_string(f.type)
                or pa.types.is_large_string(f.type)]
        pq.write_table(table, buf, use_dictionary=text)
        self.write_bytes(rel, buf.getvalue())

    def read_parquet(self, rel: str) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(self.read_bytes(rel)))

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def listdir(self, rel: str) -> list[str]:
        info = self.fs.get_file_info(pafs.FileSelector(self.path(rel), allow_not_found=True))
        return sorted(i.base_name for i in info)

    def delete(self, rel: str) -> None:
        info = self.fs.get_file_info(self.path(rel))
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(self.path(rel))
