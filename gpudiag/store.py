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

Each name is stored once (issue 36, part 1, :mod:`gpudiag.sources.names`): the rows of
``kernels``, ``runtime_api`` and ``nvtx_ranges`` are in ``kernels_coded`` (and so on), whose name
columns (``name``/``short_name``, ``name``, ``text``) hold ``names.id`` codes; ``kernels`` (and so
on) is a view of the same columns with the text, so SQL reads names as text.
:func:`read_table` reads the coded rows and gives names back dictionary-encoded. Columns are documented in :func:`gpudiag.sources.nsys_sqlite.read_export` and
:func:`gpudiag.analysis.attribution.ranges.attribute`. ``SCHEMA_VERSION`` changes whenever a table or
column changes meaning; readers refuse other versions with a message saying to re-run
``gpudiag report``.

The per-kernel tables the analysis derives (:data:`DERIVED_TABLES`) are plain SQLite tables since
schema 4, so the ``sqlite3`` shell, Datasette and sqlite-utils read them with the others (schema 3
kept them as Parquet BLOBs that only gpudiag could open): their texts as codes with a dictionary and
a view under the table's name (:mod:`gpudiag.derived_text`), written by the background writer through
ADBC like the export's tables (benchmarks/derived_tables.py, docs/notes/measurements.md 2026-11-28).

The store's state for a database this process writes (its frames kept in memory, its meta as
written, its background writer, the columns released from memory) lives on the
:class:`RunDatabase` object itself, not in module globals.
"""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import sqlite_utils

from gpudiag import derived_text
from gpudiag.version import __version__
from gpudiag.sources import names
from gpudiag.sources.columnar import as_read_back

SCHEMA_VERSION = 4  # 2: name columns as codes into ``names``; 3: derived tables as Parquet BLOBs; 4: as tables
RUN_DB_NAME = "run.sqlite"

EXPORT_TABLES = ("kernels", "runtime_api", "memcpy", "memset", "sync", "nvtx_ranges", "devices")
DERIVED_TABLES = ("kernel_attribution", "kernel_class")  # written by the analysis, one row per kernel


class StoreError(ValueError):
    """A run database that cannot be read (other schema version, not a run database, a damaged or
    missing table); the message names the file, the table and what to run."""


REBUILD = "re-run 'gpudiag report EXPORT -o RUN_DIR --force' on the nsys export to rebuild it"


class RunDatabase(sqlite_utils.Database):
    """A run database with the store's state for it: ``frames`` (table -> frame kept in memory, as it
    reads back from the file), ``meta`` (as written, or None), ``writer`` (its background
    :class:`_Writer`, or None) and ``released`` (table -> columns dropped from its frame in memory)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.frames: dict[str, pd.DataFrame] = {}
        self.meta: dict | None = None
        self.writer: _Writer | None = None
        self.released: dict[str, set[str]] = {}


def _state(db: sqlite_utils.Database) -> RunDatabase | None:
    """``db`` where it carries the store's state (a :class:`RunDatabase`), else None: a database
    opened by another reader has nothing in memory and no writer."""
    return db if isinstance(db, RunDatabase) else None


# Rows handed to pandas per to_sql call. pandas turns every column of the frame it is given into
# Python objects before its own chunking (pandas.io.sql.SQLTable.insert_data): a 13.5 M-row
# runtime-API frame took ~4 GB at once; slices bound that to a few tens of MB (docs/scale.md).
ROWS_PER_WRITE = 200_000


def write_table(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """Replace table ``name`` with ``df``. sqlite-utils creates the table from the column types;
    pandas streams the rows (a per-row Python insert would not scale to millions of kernels), in
    slices of :data:`ROWS_PER_WRITE` rows. Where ``db`` writes in the background
    (:func:`create_run_db` with ``background``), the table is queued there; :func:`flush` waits."""
    if (state := _state(db)) is not None:
        state.frames.pop(name, None)
        state.released.pop(name, None)
    _queue(db, name, df)


def _queue(db: sqlite_utils.Database, name: str, df: pd.DataFrame) -> None:
    """Write ``df`` as table ``name`` now, or queue it where ``db`` writes in the background."""
    if name in DERIVED_TABLES:  # texts once, as codes (gpudiag.derived_text), on the writer's turn
        coded, text = derived_text.split(df)
        _call(db, lambda d: _write_derived(d, name, coded, text, list(df.columns)), name)
        return
    writer = _writer(db)
    if writer is not None:
        writer.submit(name, df)
        return
    _write(db, name, df)


def _writer(db: sqlite_utils.Database) -> _Writer | None:
    state = _state(db)
    return state.writer if state is not None else None


def _write_derived(db: sqlite_utils.Database, name: str, coded: pd.DataFrame, text: pd.DataFrame,
                   columns: list[str]) -> None:
    """A derived table as ``NAME_coded`` rows, its texts in ``NAME_text`` and the view ``NAME``."""
    coded_name, text_name = names.coded_table(name), name + derived_text.TEXT_SUFFIX
    for old in (name, coded_name, text_name):
        if old in db.view_names() or old in db.table_names():
            db[old].drop()
    _write_rows(db, coded_name, coded)
    _write_rows(db, text_name, text)
    db.conn.execute(derived_text.view_sql(name, coded_name, text_name, columns, list(text["column"].unique())))
    db.conn.commit()


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
                  released: dict[str, tuple[str, ...]] | None = None) -> RunDatabase:
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
    db = RunDatabase(path)
    # 64 KiB pages (set before the first table, it fixes the file's page size): the writer, the
    # 1 M report's critical path, took 7-9 s instead of 9-11 s for the four large tables
    # (benchmarks/writer_pragmas.py, docs/scale.md)
    db.conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    full_meta = {"schema_version": SCHEMA_VERSION, "gpudiag_version": __version__, **meta}
    db["meta"].insert_all([{"key": k, "value": json.dumps(v)} for k, v in full_meta.items()], pk="key")
    db.meta = json.loads(json.dumps(full_meta))  # as read_meta reads it back
    if background:
        db.conn.commit()
        db.writer = _Writer(path)
    # The analysis that follows reads these frames, not the file: reading millions of rows back
    # cost as much as writing them (docs/scale.md). Kept before the writes are queued: a release
    # (below) always finds its frame.
    db.frames.update({name: as_read_back(df) for name, df in tables.items()})
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


def _release(db: RunDatabase, name: str, columns: tuple[str, ...]) -> None:
    """Drop ``columns`` from the frame of ``name`` kept in memory (create_run_db's ``released``)."""
    kept = db.frames.get(name)
    if kept is None:
        return
    gone = [c for c in columns if c in kept.columns]
    # said first: a reader that finds the smaller frame also finds what it lacks (read_table)
    db.released[name] = set(gone)
    db.frames[name] = kept.drop(columns=gone)


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
    writer = _writer(db)
    if writer is not None:
        writer.call(fn, name)
    else:
        fn(db)


def flush(db: sqlite_utils.Database) -> None:
    """Wait until every table queued for ``db`` is in its file; raise the first write's error.
    Later writes are made at once. A no-op where nothing writes in the background."""
    writer = _take_writer(db)
    if writer is not None:
        error = writer.close()
        if error is not None:
            raise error


def close(db: sqlite_utils.Database) -> None:
    """Wait for ``db``'s background writes (their error, if any, is left to :func:`flush`'s
    caller: this runs in ``finally`` blocks, after another error) and close its connection."""
    writer = _take_writer(db)
    if writer is not None:
        writer.close()
    db.conn.close()


def _take_writer(db: sqlite_utils.Database) -> _Writer | None:
    """``db``'s background writer, now detached from it (later writes are made at once)."""
    state = _state(db)
    if state is None:
        return None
    writer, state.writer = state.writer, None
    return writer


def read_meta(db: sqlite_utils.Database) -> dict:
    """The ``meta`` table as a dict. Raises :class:`StoreError` for another schema version."""
    state = _state(db)
    if state is not None and state.meta is not None:  # written by this process: the file may still be being written
        return json.loads(json.dumps(state.meta))
    if "meta" not in db.table_names():
        raise StoreError(f"{_file_name(db)}: not a gpudiag run database (no meta table)")
    meta = {row["key"]: json.loads(row["value"]) for row in db["meta"].rows}
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"{_file_name(db)}: run database schema {meta.get('schema_version')} is not {SCHEMA_VERSION} "
                         f"(tables {', '.join(DERIVED_TABLES)} are stored differently); {REBUILD}")
    return meta


def _file_name(db: sqlite_utils.Database) -> str:
    return _database_file(db) or "run database (in memory)"


def read_table(db: sqlite_utils.Database, name: str, without: tuple[str, ...] = ()) -> pd.DataFrame:
    """Table ``name`` as a DataFrame (empty if the table does not exist), less the columns
    ``without`` (where it has them). Tables this process wrote with :func:`create_run_db` come from
    memory, as they would read back from the file, unless their frame in memory lacks a column
    not in ``without`` (create_run_db's ``released``); the tables of :data:`DERIVED_TABLES` from
    their rows, text columns as Categoricals. Raises :class:`StoreError` for a file of another schema,
    and for a damaged or missing table of :data:`DERIVED_TABLES` (naming the file, the table and the
    command that rebuilds it)."""
    state = _state(db)
    kept = state.frames.get(name) if state is not None else None  # before what it lacks: the writer says that first
    if kept is not None and state.released.get(name, set()) <= set(without):
        # a new frame over the same columns (copy-on-write): the caller's changes stay its own
        return kept.drop(columns=[c for c in without if c in kept.columns])
    df = _read_stored(db, name)
    return df.drop(columns=[c for c in without if c in df.columns])


def _read_stored(db: sqlite_utils.Database, name: str) -> pd.DataFrame:
    """Table ``name`` as the file holds it (after the queued writes), empty if it does not."""
    writer = _writer(db)
    if writer is not None and name not in writer.pending:
        return pd.DataFrame()  # a fresh database's file holds only meta and the queued tables
    flush(db)
    state = _state(db)
    if (state is None or state.meta is None) and "meta" in db.table_names():
        read_meta(db)  # a file of another schema: one StoreError, not empty frames
    try:
        return _read_rows(db, name)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:  # a damaged page: "... is malformed"
        reason = str(exc).rsplit(": ", 1)[-1]  # pandas wraps sqlite3's words in the SQL it ran
        raise StoreError(f"{_file_name(db)}: table {name} cannot be read ({reason}); {REBUILD}") from None


def _read_rows(db: sqlite_utils.Database, name: str) -> pd.DataFrame:
    table = _rows_table(db, name)
    if table not in db.table_names():
        if name in DERIVED_TABLES and "meta" in db.table_names():
            raise StoreError(f"{_file_name(db)}: table {name} is missing; {REBUILD}")
        return pd.DataFrame()
    df = pd.read_sql_query(f'SELECT * FROM "{table}"', db.conn)
    if name in DERIVED_TABLES:  # as the analysis wrote them: text as Categoricals
        text = pd.read_sql_query(f'SELECT * FROM "{name}{derived_text.TEXT_SUFFIX}"', db.conn)
        return derived_text.joined(df, text)
    if table != name:  # names as codes: decoded through the names table, not through the view
        df = names.decoded(df, name, pd.read_sql_query(f'SELECT * FROM "{names.NAMES_TABLE}"', db.conn))
    return df


def queryable(db: sqlite_utils.Database) -> sqlite3.Connection:
    """``db``'s connection once its queued writes are in the file: every table, the derived ones
    included (schema 4), is an SQL table there, e.g.
    ``SELECT k.name, c.kernel_class FROM kernels k JOIN kernel_class c USING (kernel_id)``."""
    flush(db)
    return db.conn


def _rows_table(db: sqlite_utils.Database, name: str) -> str:
    """The table holding ``name``'s rows: its coded table where there is one, else ``name``."""
    coded = names.coded_table(name)
    return coded if coded in db.table_names() else name
