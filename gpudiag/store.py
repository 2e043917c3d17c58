"""The run database: one SQLite file (``run.sqlite``) per analysed capture, written with sqlite-utils.

It holds normalized copies of the export's tables plus gpudiag's own results, so the analysis
never reads nsys or ncu files directly. Tables (all timestamps ns, sizes bytes):

- ``meta``        key/value: schema_version, gpudiag_version, source (file name), missing (JSON list)
- ``names``       the run's kernel, API and NVTX names, each once: ``id``, ``value`` (text)
- ``kernels``     one row per kernel instance, ``kernel_id`` = row order by start time
- ``runtime_api`` CUDA runtime/driver API calls
- ``memcpy``, ``memset``, ``sync``  copies, sets and synchronizations
- ``nvtx_ranges`` NVTX push/pop and start/end ranges with text resolved
- ``devices``     GPUs of the capture
- ``ncu_kernels``  kernels measured by Nsight Compute (see :func:`gpudiag.sources.ncu.read_ncu`), if given
- ``kernel_attribution`` kernel_id -> step, phase, module, op (with shapes where recorded)
- ``kernel_class``  kernel_id -> family, roofline numbers, class
- ``parquet``     name, part, data: the tables of :data:`PARQUET_TABLES` (above: ``kernel_attribution``,
  ``kernel_class``), each as Parquet files (:func:`parquet_parts`)

Each name is stored once (issue 36, part 1, :mod:`gpudiag.sources.names`): the rows of
``kernels``, ``runtime_api`` and ``nvtx_ranges`` are in ``kernels_coded`` (and so on), whose name
columns (``name``/``short_name``, ``name``, ``text``) hold ``names.id`` codes; ``kernels`` (and so
on) is a view of the same columns with the text, so SQL reads names as text.
:func:`read_table` reads the coded rows and gives names back dictionary-encoded. Columns are documented in :func:`gpudiag.sources.nsys_sqlite.read_export` and
:func:`gpudiag.analysis.attribution.ranges.attribute`. ``SCHEMA_VERSION`` changes whenever a table or
column changes meaning; readers refuse other versions with a message saying to re-run
``gpudiag report``.

The per-kernel tables the analysis derives (:data:`PARQUET_TABLES`) are stored as Parquet inside
the file, not as SQLite rows: at a million kernels SQLite took 3-5 s to insert them, on the report's
critical path, and the Parquet files take 0.6 s (docs/scale.md, schema 3). :func:`read_table` reads them;
:func:`queryable` makes them SQL tables of a connection (temporary, in memory) for SQL readers.
"""

from __future__ import annotations

import json
import sqlite3
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import sqlite_utils

from gpudiag.version import __version__
from gpudiag.sources import names
from gpudiag.sources.columnar import as_read_back

SCHEMA_VERSION = 3  # 2: name columns as codes into ``names``; 3: PARQUET_TABLES in ``parquet``
RUN_DB_NAME = "run.sqlite"

EXPORT_TABLES = ("kernels", "runtime_api", "memcpy", "memset", "sync", "nvtx_ranges", "devices")
PARQUET_TABLES = ("kernel_attribution", "kernel_class")  # stored as Parquet (module docstring)
PARQUET_TABLE = "parquet"  # name, part, data (one Parquet file of a PARQUET_TABLES table)
# A Parquet part holds at most this many rows and bytes: SQLite's largest value is 1e9 bytes
# (SQLITE_MAX_LENGTH); a million kernels' attribution took 22 MiB (docs/scale.md), but rows of long
# distinct texts (op_args) could make a part far larger, and such a part is halved until it fits.
PARQUET_PART_ROWS = 1_000_000
PARQUET_PART_BYTES = 256 * 2**20


class StoreError(ValueError):
    """A run database that cannot be read (other schema version, not a run database)."""


# Rows handed to pandas per to_sql call. pandas turns every column of the frame it is given into
# Python objects before its own chunking (pandas.io.sql.SQLTable.insert_data): a 13.5 M-row
# runtime-API frame took ~4 GB at once; slices bound that to a few tens of MB (docs/scale.md).
ROWS_PER_WRITE = 200_000


def write_table(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """Replace table ``name`` with ``df``. sqlite-utils creates the table from the column types;
    pandas streams the rows (a per-row Python insert would not scale to millions of kernels), in
    slices of :data:`ROWS_PER_WRITE` rows. Where ``db`` writes in the background
    (:func:`create_run_db` with ``background``), the table is queued there; :func:`flush` waits.
    The tables of :data:`PARQUET_TABLES` are stored as Parquet files (:func:`parquet_parts`)."""
    _in_memory(db).pop(name, None)
    _released(db).pop(name, None)
    _queue(db, name, df)


def _queue(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """Write ``df`` as table ``name`` now, or queue it where ``db`` writes in the background."""
    if name in PARQUET_TABLES:  # made here: the writer thread is busy with the export's tables (docs/scale.md)
        parts = parquet_parts(df)
        _call(db, lambda d: _write_parts(d, name, parts), name)
        return
    writer = _WRITERS.get(db)
    if writer is not None:
        writer.submit(name, df)
        return
    _write(db, name, df)


def parquet_parts(df: pd.DataFrame) -> list[bytes]:
    """``df`` as Parquet files (lz4, no column statistics) of at most :data:`PARQUET_PART_ROWS` rows
    and :data:`PARQUET_PART_BYTES` bytes each, in row order (one file for an empty frame, holding the
    columns). Dictionary-encoded columns stay so. lz4 without statistics in 1 M-row parts took half
    the time of zstd with statistics in 250,000-row parts (1 M kernels' two tables: 0.50 against
    1.01 s, median of 5; docs/scale.md); nothing reads the statistics."""
    parts = []
    for start in range(0, max(len(df), 1), PARQUET_PART_ROWS):
        parts.extend(_parquet_within_limit(df.iloc[start:start + PARQUET_PART_ROWS]))
    return parts


def _parquet_within_limit(df: pd.DataFrame) -> list[bytes]:
    """``df`` as one Parquet file, or halves of it in order where the file would exceed
    :data:`PARQUET_PART_BYTES` (rows of long distinct texts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buffer, compression="lz4", write_statistics=False)
    data = buffer.getvalue().to_pybytes()
    if len(data) <= PARQUET_PART_BYTES or len(df) <= 1:
        return [data]
    half = len(df) // 2
    return _parquet_within_limit(df.iloc[:half]) + _parquet_within_limit(df.iloc[half:])


def _write_parts(db: sqlite_utils.Database, name: str, parts: list[bytes]) -> None:
    """Table ``name``'s Parquet ``parts`` into the ``parquet`` table, replacing any it held."""
    db.conn.execute(f'CREATE TABLE IF NOT EXISTS "{PARQUET_TABLE}" (name TEXT, part INTEGER, data BLOB)')
    db.conn.execute(f'DELETE FROM "{PARQUET_TABLE}" WHERE name = ?', (name,))
    db.conn.executemany(f'INSERT INTO "{PARQUET_TABLE}" VALUES (?, ?, ?)', [(name, i, p) for i, p in enumerate(parts)])
    db.conn.commit()


def _read_parts(db: sqlite_utils.Database, name: str) -> pd.DataFrame:
    """Table ``name`` of :data:`PARQUET_TABLES` from its Parquet parts (empty if it has none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if PARQUET_TABLE not in db.table_names():
        return pd.DataFrame()
    rows = db.conn.execute(f'SELECT data FROM "{PARQUET_TABLE}" WHERE name = ? ORDER BY part', (name,)).fetchall()
    if not rows:
        return pd.DataFrame()
    return pa.concat_tables([pq.read_table(pa.BufferReader(data)) for (data,) in rows]).to_pandas()


def _write(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """:func:`write_table` on ``db``'s own connection, now (names as their codes)."""
    for old in (name, names.coded_table(name)):
        if old in db.view_names() or old in db.table_names():
            db[old].drop()
    if names.is_coded(df, name):  # the rows with codes; a view of the same name shows the text (store docstring)
        _write_rows(db, names.coded_table(name), names.as_codes(df, name))
        db.conn.execute(names.view_sql(name, names.coded_table(name), list(df.columns)))
        db.conn.commit()
        return
    _write_rows(db, name, names.as_codes(df, name))


def _write_rows(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """Table ``name`` (absent) created and filled with ``df``."""
    if df.empty:
        # Keep the columns: an absent export table becomes an empty run-database table.
        db[name].create({c: str for c in df.columns} or {"_empty": str})
        return
    # The table's column types from the whole frame, as one to_sql call would infer them (the
    # first slice alone could hold only NULLs in a column that has numbers later).
    db.conn.execute(pd.io.sql.get_schema(df, name, con=db.conn))
    db.conn.commit()
    if not _bulk_append(db, name, df):
        for start in range(0, len(df), ROWS_PER_WRITE):
            df.iloc[start:start + ROWS_PER_WRITE].to_sql(name, db.conn, index=False, if_exists="append", chunksize=50_000)


def _bulk_append(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> bool:
    """Append ``df`` to the existing table ``name`` through Arrow and the ADBC SQLite driver, which
    binds the values in C: a third of the CPU time of pandas' ``to_sql``, which binds each value
    from Python (2 M API-call rows: 1.5 s against 4.8 s CPU, docs/scale.md), with the same stored
    values and types (tests/test_store.py). False, having written nothing, where it does not
    apply: an in-memory database (a rank's copy), no ADBC driver installed, or a column Arrow
    cannot type (mixed Python objects); the caller then uses ``to_sql``."""
    path = _database_file(db)
    if path is None:
        return False
    try:
        import adbc_driver_sqlite.dbapi as adbc
        import pyarrow as pa
    except ImportError:
        return False
    arrow_errors = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)
    try:
        with adbc.connect(path) as conn, conn.cursor() as cursor:
            try:
                for start in range(0, len(df), ROWS_PER_WRITE):  # slice by slice: one Arrow copy at a time
                    cursor.adbc_ingest(name, pa.Table.from_pandas(df.iloc[start:start + ROWS_PER_WRITE],
                                                                  preserve_index=False), mode="append")
            except arrow_errors:
                conn.rollback()  # nothing of this table was committed: to_sql writes all of it
                return False
            conn.commit()
    except adbc.Error as exc:  # a full disk, a read-only folder: in sqlite3's words, as to_sql would say it
        raise sqlite3.OperationalError(str(exc).splitlines()[0]) from None
    return True


def _database_file(db: sqlite_utils.Database) -> str | None:
    """The file behind ``db`` (None for an in-memory database)."""
    rows = db.conn.execute("PRAGMA database_list").fetchall()
    return next((r[2] for r in rows if r[1] == "main" and r[2]), None)


PAGE_SIZE = 65536  # bytes, SQLite's largest (https://www.sqlite.org/pragma.html#pragma_page_size)


def create_run_db(path: Path, tables: dict[str, pd.DataFrame], meta: dict, background: bool = False,
                  released: dict[str, tuple[str, ...]] | None = None) -> sqlite_utils.Database:
    """Write a fresh run database at ``path`` (an existing file is replaced) from ``tables``.

    With ``background``, the tables are written by one thread of this process while the caller
    goes on: the analysis reads the frames from memory, not the file, and on 2 cores the write
    (a quarter of a 1 M-kernel report, docs/scale.md) overlaps it. Every later
    :func:`write_table` on ``db`` is queued behind them, in order; :func:`flush` waits for all
    and raises the first write's error (sqlite3.OperationalError for a full disk).

    ``released``: per table, columns that its frame kept in memory drops once the table is in the
    file (the analysis does not read them; the writer did): :func:`read_table` then gives the
    table from memory only to a caller that reads it ``without`` them, and reads the file for any
    other (5 M kernels: 0.27 GB of the report's peak, docs/scale.md)."""
    if path.exists():
        path.unlink()
    db = sqlite_utils.Database(path)
    # 64 KiB pages (set before the first table, it fixes the file's page size): the writer, the
    # 1 M report's critical path, took 7-9 s instead of 9-11 s for the four large tables
    # (benchmarks/writer_pragmas.py, docs/scale.md)
    db.conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    full_meta = {"schema_version": SCHEMA_VERSION, "gpudiag_version": __version__, **meta}
    db["meta"].insert_all([{"key": k, "value": json.dumps(v)} for k, v in full_meta.items()], pk="key")
    _META[db] = json.loads(json.dumps(full_meta))  # as read_meta reads it back
    if background:
        db.conn.commit()
        _WRITERS[db] = _Writer(path)
    # The analysis that follows reads these frames, not the file: reading millions of rows back
    # cost as much as writing them (docs/scale.md). Kept before the writes are queued: a release
    # (below) always finds its frame.
    _in_memory(db).update({name: as_read_back(df) for name, df in tables.items()})
    dtype = names.dtype_of(tables)
    if dtype is not None:
        write_table(db, names.NAMES_TABLE, names.codes_frame(dtype))
        _call(db, lambda d: d[names.NAMES_TABLE].create_index(["id"], unique=True, if_not_exists=True))
    for name, df in tables.items():
        _queue(db, name, df)
        if name in (released or {}):  # right after its write: the writer's frame is done then
            _call(db, lambda _, name=name, columns=released[name]: _release(db, name, columns))
    if "kernel_id" in tables.get("kernels", pd.DataFrame()).columns:
        _call(db, lambda d: d[_rows_table(d, "kernels")].create_index(["kernel_id"], unique=True, if_not_exists=True))
    return db


def _release(db: sqlite_utils.Database, name: str, columns: tuple[str, ...]) -> None:
    """Drop ``columns`` from the frame of ``name`` kept in memory (create_run_db's ``released``)."""
    kept = _in_memory(db).get(name)
    if kept is None:
        return
    gone = [c for c in columns if c in kept.columns]
    # said first: a reader that finds the smaller frame also finds what it lacks (read_table)
    _released(db)[name] = set(gone)
    _in_memory(db)[name] = kept.drop(columns=gone)


class _Writer:
    """One thread writing a run database's tables in the order given, on its own connection
    (SQLite connections belong to their thread). ADBC binds the rows in C with the GIL released,
    so the analysis runs meanwhile (measured in docs/scale.md). ``pending`` names the tables
    queued and not yet known written."""

    def __init__(self, path: Path):
        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpudiag-run-db")
        self.futures: list[Future] = []
        self.pending: set[str] = set()
        self.db: sqlite_utils.Database | None = None

    def _db(self) -> sqlite_utils.Database:
        if self.db is None:  # opened in the writer's thread, used only there
            self.db = sqlite_utils.Database(self.path)
        return self.db

    def submit(self, name: str, df: pd.DataFrame) -> None:
        self.pending.add(name)
        self.futures.append(self.pool.submit(lambda: _write(self._db(), name, df)))

    def call(self, fn, name: str | None = None) -> None:
        if name is not None:
            self.pending.add(name)
        self.futures.append(self.pool.submit(lambda: fn(self._db())))

    def close(self) -> BaseException | None:
        """Wait for every queued write; the first error, if any (the thread's connection closed)."""
        errors = [f.exception() for f in self.futures]
        self.pool.submit(lambda: self.db and self.db.conn.close()).result()
        self.pool.shutdown()
        return next((e for e in errors if e is not None), None)


def _call(db: sqlite_utils.Database, fn, name: str | None = None) -> None:
    """``fn(db)`` now, or queued behind the background writes (as table ``name``'s, if given)."""
    writer = _WRITERS.get(db)
    if writer is not None:
        writer.call(fn, name)
    else:
        fn(db)


def flush(db: sqlite_utils.Database) -> None:
    """Wait until every table queued for ``db`` is in its file; raise the first write's error.
    Later writes are made at once. A no-op where nothing writes in the background."""
    writer = _WRITERS.pop(db, None)
    if writer is not None:
        error = writer.close()
        if error is not None:
            raise error


def close(db: sqlite_utils.Database) -> None:
    """Wait for ``db``'s background writes (their error, if any, is left to :func:`flush`'s
    caller: this runs in ``finally`` blocks, after another error) and close its connection."""
    writer = _WRITERS.pop(db, None)
    if writer is not None:
        writer.close()
    db.conn.close()


def read_meta(db: sqlite_utils.Database) -> dict:
    """The ``meta`` table as a dict. Raises :class:`StoreError` for another schema version."""
    if db in _META:  # written by this process: the file may still be being written (create_run_db)
        return json.loads(json.dumps(_META[db]))
    if "meta" not in db.table_names():
        raise StoreError(f"{db.conn}: not a gpudiag run database (no meta table)")
    meta = {row["key"]: json.loads(row["value"]) for row in db["meta"].rows}
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"run database schema {meta.get('schema_version')} is not {SCHEMA_VERSION}; "
                         "re-run 'gpudiag report' on the nsys export to rebuild it")
    return meta


def read_table(db: sqlite_utils.Database, name: str, without: tuple[str, ...] = ()) -> pd.DataFrame:
    """Table ``name`` as a DataFrame (empty if the table does not exist), less the columns
    ``without`` (where it has them). Tables this process wrote with :func:`create_run_db` come from
    memory, as they would read back from the file, unless their frame in memory lacks a column
    not in ``without`` (create_run_db's ``released``); the tables of :data:`PARQUET_TABLES` from
    their Parquet files (dictionary-encoded columns as Categoricals)."""
    kept = _in_memory(db).get(name)  # before what it lacks: the writer thread says that first (_release)
    if kept is not None and _released(db).get(name, set()) <= set(without):
        # a new frame over the same columns (copy-on-write): the caller's changes stay its own
        return kept.drop(columns=[c for c in without if c in kept.columns])
    df = _read_stored(db, name)
    return df.drop(columns=[c for c in without if c in df.columns])


def _read_stored(db: sqlite_utils.Database, name: str) -> pd.DataFrame:
    """Table ``name`` as the file holds it (after the queued writes), empty if it does not."""
    writer = _WRITERS.get(db)
    if writer is not None and name not in writer.pending:
        return pd.DataFrame()  # a fresh database's file holds only meta and the queued tables
    flush(db)
    if name in PARQUET_TABLES:
        return _read_parts(db, name)
    table = _rows_table(db, name)
    if table not in db.table_names():
        return pd.DataFrame()
    df = pd.read_sql_query(f'SELECT * FROM "{table}"', db.conn)
    if table != name:  # names as codes: decoded through the names table, not through the view
        df = names.decoded(df, name, pd.read_sql_query(f'SELECT * FROM "{names.NAMES_TABLE}"', db.conn))
    return df


def queryable(db: sqlite_utils.Database) -> sqlite3.Connection:
    """``db``'s connection, on which each table of :data:`PARQUET_TABLES` the file holds is also an
    SQL table (a temporary one of this connection, made again from the Parquet parts at each call;
    names as text, NaN as NULL), so SQL joins it with the others as before schema 3, e.g.
    ``SELECT k.name, c.kernel_class FROM kernels k JOIN kernel_class c USING (kernel_id)``. A copy
    through Python rows: for reading a run database with SQL (inspection, tests), not for the
    analysis, which reads frames (:func:`read_table`)."""
    for name in PARQUET_TABLES:
        db.conn.execute(f'DROP TABLE IF EXISTS temp."{name}"')
        df = read_table(db, name)
        if df.columns.empty:
            continue
        df = df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})
        db.conn.execute(pd.io.sql.get_schema(df, name, con=db.conn).replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
        rows = df.astype(object).where(df.notna(), None).itertuples(index=False, name=None)
        db.conn.executemany(f'INSERT INTO temp."{name}" VALUES ({", ".join("?" * len(df.columns))})', rows)
    db.conn.commit()
    return db.conn


def _rows_table(db: sqlite_utils.Database, name: str) -> str:
    """The table holding ``name``'s rows: its coded table where there is one, else ``name``."""
    coded = names.coded_table(name)
    return coded if coded in db.table_names() else name


_FRAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run database -> {table: frame}
_META: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run database -> its meta, as written
_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run database -> its background _Writer
_RELEASED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run database -> {table: columns not in memory}


def _released(db: sqlite_utils.Database) -> dict[str, set[str]]:
    return _RELEASED.setdefault(db, {})


def _in_memory(db: sqlite_utils.Database) -> dict[str, pd.DataFrame]:
    return _FRAMES.setdefault(db, {})
