"""Objects in and out of JSONL and Parquet: (line or row, dict) pairs on the way in, dicts on the way out.

This layer knows containers and formats, not record kinds: ``read`` (``retrctl.records.reader``) gives the
objects canonical field names, ``retrctl.records.trec`` reads and writes runs and qrels on top of it. Every bad
line is a RecordError naming file and line; writes are atomic (``containers.atomic_path``/``open_output``).
pyarrow is imported only when a Parquet file is read or written (``retrctl --help`` stays light).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

from retrctl.errors import RecordError
from retrctl.records.containers import _lines, atomic_path, is_parquet, open_output


def read_jsonl(path) -> Iterator[tuple[int, dict]]:
    for lineno, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(path, lineno, None, f"invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:  # a hostile '[[[[…' line
            raise RecordError(path, lineno, None, "JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise RecordError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def read_parquet(path, batch_size: int = 4096) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    if str(path) == "-":
        raise RecordError("-", message="Parquet cannot be read from stdin (stdin is JSONL): give the file's path")
    try:
        pf = pq.ParquetFile(str(path))
    except FileNotFoundError:
        raise RecordError(path, message="no such file") from None
    except Exception as e:
        raise RecordError(path, message=f"not a Parquet file ({e})") from None
    row = 0
    batches = pf.iter_batches(batch_size=batch_size)
    while True:
        try:  # a corrupt page or a truncated column chunk fails here, mid-file
            batch = next(batches, None)
            objs = [] if batch is None else batch.to_pylist()
        except Exception as e:
            raise RecordError(path, row + 1, None, f"unreadable Parquet data ({type(e).__name__}: {e})") from None
        if batch is None:
            return
        for obj in objs:
            row += 1
            yield row, obj


def read_objects(path, fmt: str | None = None) -> Iterator[tuple[int, dict]]:
    """(line or row, object) pairs from JSONL or Parquet."""
    return read_parquet(path) if is_parquet(path, fmt) else read_jsonl(path)


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of at most ``n`` items from a stream (itertools.batched, which needs Python 3.12)."""
    buf = []
    for x in items:
        buf.append(x)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf

# ---------------------------------------------------------------- writers


def _json_default(o):
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def dumps(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, default=_json_default)


class _ParquetSink:
    """Batches of records into one Parquet file whose schema grows with them.

    A batch's columns are the union of its records' keys, each typed from all its values (pyarrow's from_pylist
    keeps only the first record's keys and truncates 1.5 to 1 in an int column). When a batch brings a new
    column or a wider type (null -> list, int -> float), the rows written so far are rewritten under the unified
    schema. Values no one type can hold (a string and a number in one column) are a RecordError, before the
    target is touched.
    """

    def __init__(self, tmp: str, target):
        self.tmp, self.target, self.writer = tmp, str(target), None

    def write(self, batch: list[dict], first_row: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = list(dict.fromkeys(k for rec in batch for k in rec))
        try:
            if batch and not keys:  # a table without columns has no rows either: the records would vanish
                raise pa.ArrowInvalid("records without fields")
            table = pa.table({k: pa.array([rec.get(k) for rec in batch]) for k in keys})
            schema = table.schema if self.writer is None else pa.unify_schemas([self.writer.schema, table.schema],
                                                                              promote_options="permissive")
            if self.writer is not None and schema != self.writer.schema:
                self._rewrite(schema)
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.tmp, schema)
            self.writer.write_table(_conform(table, schema))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            last = first_row + len(batch) - 1
            rows = f"records {first_row}-{last}" if last > first_row else f"record {first_row}"
            raise RecordError(self.target, None, None, f"{rows} cannot be written as Parquet ({e}); write JSONL "
                              "instead") from None

    def _rewrite(self, schema) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.writer.close()
        old = self.tmp + ".old"
        os.replace(self.tmp, old)
        try:
            self.writer = pq.ParquetWriter(self.tmp, schema)
            for b in pq.ParquetFile(old).iter_batches():
                self.writer.write_table(_conform(pa.Table.from_batches([b]), schema))
        finally:
            os.unlink(old)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _conform(table, schema):
    """``table`` with exactly ``schema``'s columns: missing ones null, others cast (safely: no lossy casts)."""
    import pyarrow as pa

    cols = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def write(records: Iterable[dict], path="-", fmt: str | None = None, batch_size: int = 10000) -> int:
    """Write records as JSONL (compressed by extension) or Parquet; atomic for files. Returns the count."""
    n = 0
    if is_parquet(path, fmt):
        if str(path) == "-":  # a usage error: exit 2
            raise RecordError("-", message="Parquet output needs a file, not stdout: use -o FILE.parquet")
        with atomic_path(path) as tmp:
            sink = _ParquetSink(tmp, path)
            try:
                batch: list[dict] = []
                for rec in records:
                    batch.append(rec)
                    n += 1
                    if len(batch) >= batch_size:
                        sink.write(batch, n - len(batch) + 1)
                        batch = []
                if batch or sink.writer is None:
                    sink.write(batch, n - len(batch) + 1)
            finally:
                sink.close()
        return n
    with open_output(path, fmt) as f:
        for rec in records:
            f.write(dumps(rec) + "\n")
            n += 1
    return n
