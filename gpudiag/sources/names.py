"""Names once (issue 36, part 1): kernel, API and NVTX names as integer codes into one dictionary.

An export names millions of rows with a few thousand strings (``StringIds``). Each frame's name
column is a pandas ``Categorical`` of one dtype shared by every name column of the run: a small
integer code per row (int8 to int32, as many bits as the dictionary needs), the text stored once. Row filters copy the codes, string methods run once per
distinct name (pandas maps them over the categories), and the text of a row is looked up only
where it is shown. Categories are sorted, so ordering by a name column orders by its text, as
before. The run database keeps the codes (``kernels_coded`` and so on), the ``names`` table
(:func:`codes_frame`) and views with the text under the tables' own names (:func:`view_sql`);
:func:`decoded` reads the codes back. Measured in docs/scale.md (issue 36).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The name columns of the export's tables, as gpudiag.sources.nsys_sqlite.read_export names them.
NAME_COLUMNS = {"kernels": ("name", "short_name"), "runtime_api": ("name",), "nvtx_ranges": ("text",)}
NAMES_TABLE = "names"  # the run database's dictionary: id (the code), value (the text)
CODED_SUFFIX = "_coded"  # kernels_coded: the rows with their names' codes; kernels: a view with the text


def coded_table(table: str) -> str:
    """The run database table that holds ``table``'s rows with its names as codes."""
    return f"{table}{CODED_SUFFIX}"


def view_sql(view: str, table: str, columns: list[str]) -> str:
    """CREATE VIEW ``view`` over the coded ``table`` (columns ``columns``, in order), each name
    column's code replaced by its text: SQL on the run database reads names as text, as before."""
    names = set(NAME_COLUMNS.get(view, ()))
    cols = ", ".join(f'(SELECT value FROM "{NAMES_TABLE}" WHERE id = t."{c}") AS "{c}"' if c in names else f't."{c}"'
                     for c in columns)
    return f'CREATE VIEW "{view}" AS SELECT {cols} FROM "{table}" AS t'


def categorical(values: np.ndarray, codes: np.ndarray, index: pd.Index) -> pd.Series:
    """A Series on ``index`` whose row *i* is ``values[codes[i]]`` (so code -1 is the last value;
    a None value is NULL), dictionary-encoded: ``values`` (an object array of str or None, few) are
    the distinct names, ``codes`` an int array of one entry per row."""
    text_codes, categories = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
    return pd.Series(pd.Categorical.from_codes(text_codes[codes], categories=pd.Index(categories, dtype=object)),
                     index=index)


def filled(series: pd.Series, other: pd.Series) -> pd.Series:
    """``series`` with its NULLs taken from ``other`` (same index), both dictionary-encoded or text;
    the result is dictionary-encoded."""
    a, b = _as_categorical(series), _as_categorical(other)
    both = a.cat.categories.union(b.cat.categories, sort=False)
    a, b = a.cat.set_categories(both), b.cat.set_categories(both)
    return a.where(a.notna(), b)


def encode(frames: list[dict[str, pd.DataFrame]]) -> pd.CategoricalDtype:
    """Give every name column (:data:`NAME_COLUMNS`) of every frame in ``frames`` (dicts of table
    name -> frame, changed in place) one dictionary: the sorted distinct names of them all. Returns
    that dtype. Only the dictionaries are merged (a few thousand names); the rows' codes are
    remapped by an array lookup."""
    columns = [(tables, table, column) for tables in frames for table, cols in NAME_COLUMNS.items()
               for column in cols if table in tables and column in tables[table]]
    for tables, table, column in columns:
        tables[table][column] = _as_categorical(tables[table][column])
    # "" is always a name: the analysis fills a NULL name with it (fillna("") on a dictionary-encoded
    # column takes only a value of its dictionary)
    every = [np.array([""], dtype=object)] + [tables[table][column].cat.categories.to_numpy(dtype=object)
                                              for tables, table, column in columns]
    dtype = pd.CategoricalDtype(pd.Index(np.unique(np.concatenate(every)), dtype=object))
    for tables, table, column in columns:
        tables[table][column] = recoded(tables[table][column], dtype)
    return dtype


def recoded(series: pd.Series, dtype: pd.CategoricalDtype) -> pd.Series:
    """The dictionary-encoded ``series`` with the codes of ``dtype``, whose categories hold all of
    ``series``'s."""
    old = series.cat.categories
    if old.equals(dtype.categories):
        return series
    where = np.append(dtype.categories.get_indexer(old), -1)
    return pd.Series(pd.Categorical.from_codes(where[series.cat.codes.to_numpy()], dtype=dtype), index=series.index,
                     name=series.name)


def _as_categorical(series: pd.Series) -> pd.Series:
    """``series`` dictionary-encoded (kept where it already is; an all-NULL column stays empty)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series
    return series.astype(object).astype("category")


def dtype_of(tables: dict[str, pd.DataFrame]) -> pd.CategoricalDtype | None:
    """The dictionary of the run's name columns in ``tables`` (table name -> frame), as
    :func:`encode` made it; None where no name column is dictionary-encoded."""
    return next((tables[t][c].dtype for t, cols in NAME_COLUMNS.items() for c in cols
                 if t in tables and c in tables[t] and isinstance(tables[t][c].dtype, pd.CategoricalDtype)), None)


def codes_frame(dtype: pd.CategoricalDtype) -> pd.DataFrame:
    """The run database's ``names`` table of ``dtype``: ``id`` (the code), ``value`` (the text)."""
    return pd.DataFrame({"id": np.arange(len(dtype.categories), dtype=np.int64),
                         "value": dtype.categories.to_numpy(dtype=object)})


def as_codes(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """``df`` (run database table ``table``) as the run database stores it: its dictionary-encoded
    name columns (:data:`NAME_COLUMNS`) as their codes (integers; float64 with NULL as NaN), any
    other dictionary-encoded column as text. ``df`` itself where nothing changes."""
    cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
    if not cats:
        return df
    out = df.copy(deep=False)
    for c in cats:
        if c not in NAME_COLUMNS.get(table, ()):
            out[c] = df[c].astype(object)
            continue
        codes = df[c].cat.codes.to_numpy()
        # the codes' own width (int8-int32): SQLite stores an integer in as few bytes as it needs, so the
        # stored values and column type are the same as from int64, without an int64 copy (13.5 M API calls: 108 MB)
        out[c] = codes if (codes >= 0).all() else np.where(codes >= 0, codes, np.nan)
    return out


def is_coded(df: pd.DataFrame, table: str) -> bool:
    """Whether the run database stores ``df`` (table ``table``) with its names as codes."""
    return any(isinstance(df[c].dtype, pd.CategoricalDtype) for c in NAME_COLUMNS.get(table, ()) if c in df.columns)


def decoded(df: pd.DataFrame, table: str, names: pd.DataFrame) -> pd.DataFrame:
    """``df`` as read from the run database's ``table``, with its name columns (codes) decoded
    through ``names`` (the ``names`` table) into one dictionary-encoded dtype."""
    cols = [c for c in NAME_COLUMNS.get(table, ()) if c in df.columns]
    if not cols or names.empty:
        return df
    order = np.argsort(names["id"].to_numpy())
    dtype = pd.CategoricalDtype(pd.Index(names["value"].to_numpy(dtype=object)[order], dtype=object))
    out = df.copy(deep=False)
    for c in cols:
        codes = pd.to_numeric(df[c], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
        out[c] = pd.Categorical.from_codes(codes, dtype=dtype)
    return out


def spread(values: np.ndarray, index: np.ndarray, missing: str = "") -> pd.Categorical:
    """Row *i* is ``values[index[i]]`` (``missing`` where ``index[i]`` is -1), dictionary-encoded
    with sorted categories: the module, phase or op of each of a million kernels from a few
    thousand ranges, with the text of each distinct value stored once (turning a million
    repeated strings into a string column took most of the attribution's time, docs/scale.md).
    ``values``: an object array of str, one per range; ``index``: an int array per row."""
    codes, uniques = pd.factorize(np.append(np.asarray(values, dtype=object), missing), use_na_sentinel=False)
    order = np.argsort(uniques.astype(str), kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return pd.Categorical.from_codes(rank[codes][index], categories=pd.Index(uniques[order], dtype=object))
