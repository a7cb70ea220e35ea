"""The types the KPI history stores: how a part is written and when one is refused.

Writers normalise every column (`normalised`); readers check each part's footer
(`part_problem`) and quarantine one they cannot unify with the others. One place for both,
so a part Telltale writes always passes the check it reads with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa

from analysis.arrow_memory import use_system_allocator
from analysis.kpi import BASE_COLUMNS
from core.errors import ResultsError

__all__ = ["SCHEMA_VERSION", "VERSION_KEY", "WRITTEN_AT", "decoded", "is_text", "normalised",
           "part_problem", "write_parquet"]

WRITTEN_AT = "_written_at"
"""Column holding each row's write time (ns): the newest write of a run wins."""
SCHEMA_VERSION = 3
"""Version of the parts this code writes (1: before `IDENTITY`; 2: before `VALIDITY` and
`FINGERPRINT`)."""
VERSION_KEY = b"telltale.history.schema"
"""The part footer's metadata key holding `SCHEMA_VERSION`."""

# Every analysis that writes or reads a table imports this module first: Arrow's buffers
# come from the C library's allocator from here on (`analysis.arrow_memory`).
use_system_allocator()


def is_text(kind: pa.DataType) -> bool:
    """Whether ``kind`` is a text type (string, large string or string view)."""
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or getattr(pa.types, "is_string_view", lambda _: False)(kind))


# The type each base column must have (a part with another is quarantined, never read).
BASE_TYPES: dict[str, Any] = {
    "run_uuid": is_text, "kpi": is_text,
    "value": lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
    # UTC-aware: a naive time cannot be unified with the others (ArrowTypeError on every read)
    "timestamp": lambda t: pa.types.is_timestamp(t) and t.tz is not None, "unit": is_text,
    "lower_better": pa.types.is_boolean, "ignored_for_regression": pa.types.is_boolean,
    WRITTEN_AT: pa.types.is_integer,
}


def decoded(column: pd.Series) -> pd.Series:
    """``column`` with a dictionary-encoded (categorical) column as its plain values.

    The KPI table holds its label and per-run columns dictionary-encoded (`analysis.kpi.
    kpi_table`: one copy of each value, not one a row); every file stores them as the text
    columns they were before (pandas ``string``), so no reader of a file meets a dictionary.
    """
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column
    kind = column.dtype.categories.dtype
    return column.astype("string" if pd.api.types.is_string_dtype(kind) else kind)


def write_parquet(frame: pd.DataFrame, stream: Any, *, rows_per_group: int = 16_384) -> None:
    """Write ``frame`` as Parquet to ``stream``, dictionary-encoded columns as text.

    The one way a table leaves post-processing as Parquet (the KPI and runs tables): the
    file holds the types the history stores. Decoded a row group at a time, so a 10 000-run
    table never holds a text copy of each label beside its codes.
    """
    import pyarrow.parquet as pq

    schema = _file_schema(frame)
    with pq.ParquetWriter(stream, schema) as writer:
        for start in range(0, max(len(frame), 1), rows_per_group):
            # safeio-exempt: writes the stream its caller opened with atomic_open
            writer.write_table(pa.Table.from_pandas(
                _decoded_rows(frame.iloc[start:start + rows_per_group]), schema=schema,
                preserve_index=False))


def _decoded_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with every column `decoded` (the others not copied)."""
    return pd.DataFrame({name: decoded(rows[name]) for name in rows.columns},
                        index=rows.index, copy=False)


def _file_schema(frame: pd.DataFrame) -> pa.Schema:
    """The Arrow schema of ``frame`` with each dictionary-encoded column as its values.

    Inferred on the whole frame (a column of objects is typed by all its rows, not by a
    first row group that may hold only nulls); the pandas metadata of an encoded column is
    that of its decoded values, so pandas reads the file back as text.
    """
    import json

    whole = pa.Schema.from_pandas(frame, preserve_index=False)
    encoded = [f.name for f in whole if pa.types.is_dictionary(f.type)]
    if not encoded:
        return whole
    plain = pa.Schema.from_pandas(_decoded_rows(frame[encoded].iloc[:0]),
                                  preserve_index=False)
    meta = json.loads(whole.metadata[b"pandas"])
    plain_meta = {c["name"]: c for c in json.loads(plain.metadata[b"pandas"])["columns"]}
    meta["columns"] = [plain_meta.get(c["name"], c) for c in meta["columns"]]
    fields = [plain.field(f.name) if f.name in plain_meta else f for f in whole]
    return pa.schema(fields, metadata={**whole.metadata, b"pandas": json.dumps(meta).encode()})


def normalised(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with every column in the type the history stores, or a clear refusal.

    ``timestamp`` UTC-aware (a naive time is taken as UTC), ``value`` float, the flags
    bool, ids and labels text (null stays null): a part this code writes always passes
    `part_problem`, so no reader ever meets a type it cannot unify.

    Raises:
        ResultsError: A column cannot take its type (names the column).
    """
    out = frame.copy()
    casts: dict[str, Callable[[pd.Series], pd.Series]] = {
        "timestamp": lambda c: pd.to_datetime(c, utc=True).astype("datetime64[ns, UTC]"),
        "value": lambda c: pd.to_numeric(c).astype("float64"),
        "lower_better": lambda c: c.astype(bool),
        "ignored_for_regression": lambda c: c.astype(bool),
    }
    for name in out.columns:
        if name == WRITTEN_AT:
            continue
        column = out[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            column = out[name] = decoded(column)
        try:
            if name in casts:
                out[name] = casts[name](column)
            elif pd.api.types.infer_dtype(column, skipna=True) not in ("string", "empty"):
                out[name] = column.map(lambda v: None if v is None or (
                    isinstance(v, float) and v != v) else str(v))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ResultsError(f"history rows: column {name} cannot be stored as the history "
                               f"stores it: {str(exc)[:200]}") from None
    return out


def part_problem(schema: pa.Schema) -> str | None:
    """Why a part cannot be read with the others (None: it can)."""
    version_text = (schema.metadata or {}).get(VERSION_KEY, b"1")
    try:
        version = int(version_text)
    except ValueError:
        return f"unreadable schema version {version_text[:20]!r}"
    if version > SCHEMA_VERSION:
        return (f"schema version {version} is newer than this Telltale reads "
                f"({SCHEMA_VERSION}): upgrade Telltale to read it")
    names = set(schema.names)
    missing = [c for c in (*BASE_COLUMNS, WRITTEN_AT) if c not in names]
    if missing:
        return f"not a Telltale history part: no {', '.join(missing)} column"
    for name, is_ok in BASE_TYPES.items():
        kind = schema.field(name).type
        if not is_ok(kind):
            return f"column {name} is {kind}, not the type the history stores"
    for item in schema:
        if item.name not in BASE_TYPES and item.name != WRITTEN_AT and not (
                is_text(item.type) or pa.types.is_null(item.type)):
            return f"label column {item.name} is {item.type}, not text"
    return None
