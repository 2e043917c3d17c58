"""The derived per-kernel tables' text columns stored once (schema 4, issue 47 part 2).

``kernel_class`` and ``kernel_attribution`` repeat a few hundred texts (family, class, module,
op, op_args) over every kernel. As plain SQLite text, 1 M kernels took 2.1 s to write and 128 MiB
(5 M: 12.2 s, 643 MiB; benchmarks/derived_tables.py). Here each text column is stored as integer
codes in ``TABLE_coded`` with its texts once in ``TABLE_text`` (column, code, value), and a view
under the table's own name gives the text back, so plain SQL reads the table as before:
``sqlite3 run.sqlite 'select kernel_class, count(*) from kernel_class group by 1'``.
"""

from __future__ import annotations

import pandas as pd

TEXT_SUFFIX = "_text"


def text_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` stored as codes: Categoricals and text."""
    return [c for c in df.columns
            if isinstance(df[c].dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(df[c].dtype)
            or df[c].dtype == object]


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``df`` with each text column as nullable integer codes (NULL for a missing value), and the
    dictionary: one row (column, code, value) per distinct text of each column."""
    coded, rows = df.copy(), []
    for c in text_columns(df):
        cat = df[c].astype("category")
        codes = pd.Series(cat.cat.codes.to_numpy(), index=df.index, dtype="Int32")
        coded[c] = codes.mask(codes < 0)
        rows.append(pd.DataFrame({"column": c, "code": range(len(cat.cat.categories)),
                                  "value": cat.cat.categories.astype(str)}))
    text = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame({"column": [], "code": [], "value": []})
    return coded, text


def joined(coded: pd.DataFrame, text: pd.DataFrame) -> pd.DataFrame:
    """The frame :func:`split` took apart: each coded column back as a Categorical."""
    out = coded.copy()
    for c, values in text.groupby("column", sort=False):
        if c in out:
            categories = values.sort_values("code")["value"].to_numpy(dtype=object)
            codes = out[c].fillna(-1).astype("int64").to_numpy()
            out[c] = pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))
    return out


def view_sql(view: str, coded: str, text: str, columns: list[str], text_cols: list[str]) -> str:
    """CREATE VIEW ``view`` over ``coded`` with each of ``text_cols`` looked up in ``text``."""
    cols = ", ".join(
        f'(SELECT value FROM "{text}" WHERE "column" = \'{c}\' AND code = t."{c}") AS "{c}"' if c in text_cols
        else f't."{c}"' for c in columns)
    return f'CREATE VIEW "{view}" AS SELECT {cols} FROM "{coded}" AS t'
