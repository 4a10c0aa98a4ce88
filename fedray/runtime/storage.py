"""Run-directory I/O through ``pyarrow.fs``: a local path or a URI (``s3://``, ``gs://``,
``hdfs://``) behaves the same, so a cluster can point runs and client state at shared
object storage."""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import pyarrow.fs as pafs


class Storage:
    """A directory on some filesystem; paths are relative to its root."""

    def __init__(self, uri: str):
        self.uri = uri
        if "://" in uri:
            self.fs, self.root = pafs.FileSystem.from_uri(uri)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(uri)
        self.fs.create_dir(self.root, recursive=True)

    def __reduce__(self):
        return (Storage, (self.uri,))

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write atomically where the filesystem allows (temp file + move)."""
        target = self.path(rel)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        tmp = f"{target}.tmp-{os.getpid()}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, target)

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def write_pickle(self, rel: str, obj: Any) -> int:
        data = pickle.dumps(obj, protocol=5)
        self.write_bytes(rel, data)
        return len(data)

    def read_pickle(self, rel: str) -> Any:
        return pickle.loads(self.read_bytes(rel))

    def write_parquet(self, rel: str, table: Any) -> None:
        """A ``pyarrow.Table`` (or a list of row dicts) as one Parquet file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not isinstance(table, pa.Table):
            table = pa.Table.from_pylist(table)
        buf = io.BytesIO()
        pq.write_table(table, buf)
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
