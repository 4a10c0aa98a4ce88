"""Run metrics as Parquet: one part file per round while running (append-only, crash-safe),
consolidated into ``rounds.parquet`` and ``clients.parquet`` when the run ends.

Readable by pandas, polars and duckdb: ``pandas.read_parquet("RUN/rounds.parquet")``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.core.storage import Storage

KINDS = ("rounds", "clients")


def _finite(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy scalars
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj: Any, indent: int | None = None) -> str:
    """``obj`` as strict JSON: NaN and ±Infinity (which ``json.dumps`` writes bare, and
    strict parsers reject) become null; other unknown values their ``str``."""
    import json

    return json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False)


def _column(values: list[Any]) -> Any:
    """A metrics column: numbers with at least one float (and gaps: None) become float64
    with NaN for the gaps; anything else (ints, strings, bools, all-None) as it is, for
    Arrow to type."""
    kinds = set(map(type, values))
    if all(t is type(None) or issubclass(t, (int, float)) and not issubclass(t, bool)
           for t in kinds) and any(issubclass(t, float) for t in kinds):
        return np.array(values, dtype=np.float64)  # None → NaN
    return values


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as a table: the union of their keys in first-seen order (:func:`_column`)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return columns_table({k: [r.get(k) for r in rows] for k in keys})


def columns_table(columns: dict[str, list[Any]]) -> pa.Table:
    """Columns (name → one value per row, None where a row has none) as a table."""
    return pa.table({k: _column(v) for k, v in columns.items()})


class MetricsWriter:
    def __init__(self, storage: Storage):
        self.storage = storage

    def write_round(self, round: int, round_row: dict[str, Any],
                    client_columns: dict[str, list[Any]]) -> None:
        """The round's part files: its row, and its clients' rows (columns, as
        :func:`fedray.runtime.rows.client_columns` gives them) when it has any."""
        self.storage.write_parquet(f"metrics/rounds/{round:06d}.parquet", _table([round_row]))
        if client_columns.get("client_id"):
            self.storage.write_parquet(f"metrics/clients/{round:06d}.parquet",
                                       columns_table(client_columns))

    def truncate_after(self, round: int) -> None:
        """Drop part files of rounds after ``round`` (a resumed run redoes them)."""
        for kind in KINDS:
            for f in self.storage.listdir(f"metrics/{kind}"):
                if re.fullmatch(r"\d+\.parquet", f) and int(f[:-8]) > round:
                    self.storage.delete(f"metrics/{kind}/{f}")

    def read(self, kind: str) -> pa.Table | None:
        parts = [f for f in self.storage.listdir(f"metrics/{kind}") if f.endswith(".parquet")]
        tables = [self.storage.read_parquet(f"metrics/{kind}/{f}") for f in parts]
        if not tables:
            return None
        return pa.concat_tables(tables, promote_options="permissive")

    def consolidate(self) -> None:
        for kind in KINDS:
            table = self.read(kind)
            if table is not None:
                self.storage.write_parquet(f"{kind}.parquet", table)


def read_metrics(run_dir: str, kind: str = "rounds") -> pa.Table:
    """The ``rounds`` or ``clients`` table of a run (consolidated file or part files)."""
    storage = Storage(run_dir)
    if storage.exists(f"{kind}.parquet"):
        return storage.read_parquet(f"{kind}.parquet")
    table = MetricsWriter(storage).read(kind)
    if table is None:
        raise FileNotFoundError(f"no {kind} metrics under {run_dir}")
    return table
