"""Kernels of ``torch.compile``d graphs, put back under the modules they came from.

Inside a compiled graph gpudiag adds no module ranges, so :func:`~gpudiag.analysis.attribution.ranges.attribute`
gives its kernels the module around the compiled call (often the whole model). The launcher records,
per compiled graph, Inductor's kernel call sites in call order with the module each came from
(:mod:`gpudiag.capture.inductor_provenance`), and wraps every run of a graph in a
``gpudiag:graph <id>`` range. Here, for the kernels launched inside such a range:

- a kernel whose name is a call site's kernel name (Triton kernels keep Inductor's name on the GPU)
  takes that call site's module: the k-th launch of a name in one run is its k-th call site;
- the other kernels (cuBLAS/cuDNN/aten kernels of extern calls such as ``extern_kernels.mm``) lie
  between two name-matched kernels: they take the extern call sites between those two call sites,
  one each when the counts agree, else the single extern call, else the module enclosing them all;
- the rest keep the module from NVTX and count as unmapped.

Module paths recorded at compile time are relative to the compiled callable; they are joined to the
module range around the compiled call (for a backward graph: around the forward graph of the same
compilation), so they read like eager paths (``blocks.0.fc1``).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from typing import NamedTuple

import numpy as np
import pandas as pd

from gpudiag import nvtx_names
from gpudiag.analysis.attribution.ranges import innermost_range
from gpudiag.script_status import ScriptStatus


class Match(NamedTuple):
    """Call sites one launch may come from (indices into the graph's records) and how it was
    matched: ``name``, ``order``, ``coarse`` (several candidate sites) or ``unmapped``."""

    sites: tuple[int, ...]
    how: str


class Prefix(NamedTuple):
    """The module range around a compiled call: path, class, whether it is the root model, and
    whether it is exact (False: the common part of several, for a backward graph)."""

    path: str
    cls: str
    is_root: bool
    exact: bool = True


UNMAPPED = Match((), "unmapped")


def common_module(paths) -> str:
    """Longest common dotted prefix of module paths ('' when they share none)."""
    parts = [p.split(".") for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def align_call(names: list[str], site_names: list[str]) -> list[Match]:
    """Match one graph run's kernel launches (``names``, in launch order) to the graph's call sites
    (``site_names``: recorded kernel names, in the wrapper's call order). One :class:`Match` per
    launch. Pure; any input is valid."""
    by_name: dict[str, list[int]] = {}
    for i, n in enumerate(site_names):
        by_name.setdefault(n, []).append(i)
    launches = Counter(names)
    out, seen = [UNMAPPED] * len(names), {}
    for j, n in enumerate(names):
        idx = by_name.get(n)
        if not idx:
            continue
        k = seen[n] = seen.get(n, -1) + 1
        if len(idx) == 1 or launches[n] == len(idx):  # one site, or one launch per site
            out[j] = Match((idx[min(k, len(idx) - 1)],), "name")
        else:  # more launches than sites (autotuning on a first run): any of them
            out[j] = Match(tuple(idx), "coarse")
    return _fill_gaps(out, site_names, set(site_names) & set(names))


def _fill_gaps(out: list[Match], site_names: list[str], launched: set) -> list[Match]:
    """Launches between two name-matched ones take the call sites between those two sites whose
    name is never launched (extern calls: their GPU kernels are cuBLAS', aten's, ...)."""
    anchors = [(j, m.sites[0]) for j, m in enumerate(out) if m.how == "name"]
    bounds = [(-1, -1), *anchors, (len(out), len(site_names))]
    for (j0, s0), (j1, s1) in zip(bounds, bounds[1:]):
        gap = [j for j in range(j0 + 1, j1) if out[j].how == "unmapped"]
        extern = [i for i in range(s0 + 1, s1) if site_names[i] not in launched]
        if not gap or not extern:
            continue
        if len(extern) == len(gap):
            for j, i in zip(gap, extern):
                out[j] = Match((i,), "order")
        else:
            for j in gap:
                out[j] = Match((extern[0],), "order") if len(extern) == 1 else Match(tuple(extern), "coarse")
    return out


def resolve_site(match: Match, sites: list[dict], prefix: Prefix | None) -> tuple[str | None, str | None, str | None, str]:
    """(module path, module class, source line, how) of one matched launch; path None: unmapped."""
    recs = [sites[i] for i in match.sites]
    if not recs or any(r.get("module") is None for r in recs):
        return None, None, None, "unmapped"
    mods = {r["module"] for r in recs}
    if len(mods) == 1:  # candidate sites of one module (or a single site): exact
        rel, how = next(iter(mods)), ("order" if match.how == "coarse" else match.how)
    else:
        rel, how = common_module(mods), "coarse"
    if how == "coarse" and not rel:
        return None, None, None, "unmapped"  # candidates in unrelated modules: no honest answer
    rec = recs[0]
    if rel:
        if prefix is None or prefix.is_root or rec.get("root") not in ("self", None):
            path = rel  # the compiled callable is the root model, or a function given the model
        elif prefix.exact:
            path = f"{prefix.path}.{rel}"
        elif prefix.path:
            path, how = prefix.path, "coarse"
        else:
            return None, None, None, "unmapped"
        cls = rec.get("module_class") if how != "coarse" else None
    elif prefix is not None and prefix.path:
        path, cls = prefix.path, prefix.cls  # the compiled module's own forward code
    else:
        return None, None, None, "unmapped"
    sources = {r.get("source") for r in recs}
    source = sources.pop() if len(sources) == 1 else None
    return path, cls, source, how


# ---- the table -------------------------------------------------------------------------------

def _prefixes(att: pd.DataFrame, call: np.ndarray, graph_of_call: np.ndarray, graphs: dict) -> dict[int, Prefix]:
    """Call index -> :class:`Prefix`: the module around a run (the first kernel's NVTX module);
    for runs with none (backward graphs run outside every module range), the module around the
    forward runs of the same compilation (compile id)."""
    inside = call >= 0
    first = pd.DataFrame({"call": call[inside], "module": att["module"].to_numpy()[inside],
                          "cls": att["module_class"].to_numpy()[inside]}).drop_duplicates("call")
    own = {int(r.call): Prefix(r.module, r.cls, "." not in r.module and r.module == r.cls)
           for r in first.itertuples(index=False) if r.module}
    compile_id = {int(g): (info or {}).get("compile_id") for g, info in graphs.items()}
    by_compile: dict = {}
    for c, p in own.items():
        by_compile.setdefault(compile_id.get(int(graph_of_call[c])), set()).add(p)
    out = dict(own)
    for c in set(first["call"].astype(int)) - set(own):
        cid = compile_id.get(int(graph_of_call[c]))
        seen = by_compile.get(cid, set()) if cid is not None else set()
        if len(seen) == 1:
            out[c] = next(iter(seen))
        elif seen:
            out[c] = Prefix(common_module(p.path for p in seen), "", False, exact=False)
    return out


def _launch_order(kernels: pd.DataFrame, att: pd.DataFrame, call: np.ndarray) -> pd.DataFrame:
    """Kernels inside graph runs, in launch order per run: by launch call, then (graph launches,
    whose kernels share one call) by GPU start."""
    names = kernels["short_name"] if "short_name" in kernels else kernels["name"]
    names = names.where(names.notna(), kernels["name"]).astype(str).to_numpy()
    df = pd.DataFrame({"call": call, "api": att["api_start_ns"].to_numpy(dtype=float),
                       "start": kernels["start_ns"].to_numpy(dtype=float), "name": names,
                       "pos": np.arange(len(kernels))})
    return df[df["call"] >= 0].sort_values(["call", "api", "start"], kind="stable")


def attribute_compiled(kernels: pd.DataFrame, attribution: pd.DataFrame, nvtx: pd.DataFrame,
                       provenance: dict | None) -> tuple[pd.DataFrame, dict]:
    """Re-attribute kernels launched inside compiled-graph runs.

    ``kernels``: the run database's kernels (name, short_name if present, start_ns, duration_ns);
    ``attribution``: :func:`~gpudiag.analysis.attribution.ranges.attribute`'s table, same row order;
    ``nvtx``: NVTX ranges (text, start_ns, end_ns, global_tid), the ``gpudiag:graph <id>`` ones are
    used; ``provenance``: the launcher's ``inductor_provenance`` status entry (None: no provenance).

    Returns (a copy of ``attribution`` with ``module``/``module_class`` set from provenance where it
    maps, and new columns ``graph`` (graph id, -1 outside compiled runs), ``source_line`` (``file:line``,
    '' if unknown), ``compiled_mapping`` ('' outside compiled runs, else name/order/coarse/unmapped),
    ``compiled_op`` / ``compiled_op_args`` (the contraction a launch's one call site recorded, with its
    shapes as an op range payload, :func:`site_cost`; '' if none) and ``compiled_op_call`` (one id per
    graph run and call site, -1 without a cost),
    summary dict: see :func:`summarize`). Raises nothing for missing or malformed provenance."""
    out = attribution.copy(deep=False)  # copy-on-write: the columns set below are the only ones copied
    out["graph"], out["source_line"], out["compiled_mapping"] = -1, "", ""
    out["compiled_op"], out["compiled_op_args"], out["compiled_op_call"] = "", "", -1
    graphs = (provenance or {}).get("graphs") or {}
    text = nvtx["text"].fillna("") if not nvtx.empty else pd.Series(dtype=str)
    ranges = nvtx[text.str.startswith(nvtx_names.GRAPH)].reset_index(drop=True) if not nvtx.empty else nvtx
    if ranges.empty or kernels.empty:
        return out, summarize(kernels, out, provenance)
    # ``gpudiag:graph 3``, or ``gpudiag:graph 3 s33=8`` for a run of a dynamic-shape graph
    tail = ranges["text"].str[len(nvtx_names.GRAPH):]
    range_graph = pd.to_numeric(tail.str.extract(r"^(\d+)", expand=False), errors="coerce").fillna(-1).astype(int).to_numpy()
    range_symbols = tail.str.partition(" ")[2].to_numpy(dtype=object)
    call = innermost_range(ranges, out["api_start_ns"].to_numpy(dtype=float), out["api_tid"].to_numpy(dtype=float))
    out["graph"] = np.where(call >= 0, range_graph[np.maximum(call, 0)], -1)
    out.loc[call >= 0, "compiled_mapping"] = "unmapped"
    prefixes = _prefixes(out, call, range_graph, graphs)
    cols = {c: out[c].to_numpy(dtype=object).copy() for c in ("module", "module_class", "source_line", "compiled_mapping",
                                                                "compiled_op", "compiled_op_args")}
    site_call = np.full(len(out), -1, dtype=np.int64)  # (run, call site) of a launch with a recorded cost
    radix = 1 + max((len((g or {}).get("kernels") or []) for g in graphs.values()), default=0)
    memo: dict = {}
    for c, run in _launch_order(kernels, out, call).groupby("call", sort=False):
        sites = (graphs.get(str(range_graph[c])) or {}).get("kernels") or []
        key = (range_graph[c], tuple(run["name"]), prefixes.get(c))
        if key not in memo:
            matches = align_call(list(run["name"]), [s.get("name") for s in sites])
            memo[key] = [(resolve_site(m, sites, prefixes.get(c)), site_cost(m, sites)) for m in matches]
        for pos, ((path, cls, source, how), (site, op, args)) in zip(run["pos"].to_numpy(), memo[key]):
            cols["compiled_mapping"][pos] = how
            cols["source_line"][pos] = source or ""
            if path is not None:
                cols["module"][pos], cols["module_class"][pos] = path, cls or ""
            if site >= 0 and (args := bound_payload(args, range_symbols[c], memo)):
                cols["compiled_op"][pos], cols["compiled_op_args"][pos] = op, args
                site_call[pos] = int(c) * radix + site
    for name, values in cols.items():
        out[name] = values
    # one id per (graph run, call site): the kernels of one extern call (a GEMM and its split-K
    # reduction) share the call's cost, as the kernels of one eager op call do
    has = site_call >= 0
    calls = np.full(len(out), -1, dtype=np.int64)
    calls[has] = pd.factorize(site_call[has])[0]
    out["compiled_op_call"] = calls
    return out, summarize(kernels, out, provenance)


def site_cost(match: Match, sites: list[dict]) -> tuple[int, str, str]:
    """(call site index, aten op, op payload JSON) of a launch matched to exactly one call site that
    recorded its contraction's shapes (``cost``, :func:`gpudiag.capture.inductor_provenance.contraction_payload`);
    (-1, "", "") otherwise (a coarse match could be another site's launch)."""
    if match.how not in ("name", "order") or len(match.sites) != 1:
        return -1, "", ""
    cost = sites[match.sites[0]].get("cost")
    if not isinstance(cost, dict) or not isinstance(cost.get("op"), str):
        return -1, "", ""
    return match.sites[0], cost["op"], json.dumps(cost, separators=(",", ":"))


_SIZE = re.compile(r"^(\w+)\[([^\]]*)\]$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Pow: lambda a, b: a ** b if 0 <= b <= 8 else _unreadable()}
_CALLS = {"Max": max, "Min": min, "CeilDiv": lambda a, b: -(-a // b), "FloorDiv": operator.floordiv}


def _unreadable():
    raise ValueError("exponent")


def _size(expr: str, values: dict[str, int]) -> int:
    """One size of a traced shape: an int, or a SymPy expression of size symbols (``s33``,
    ``64*s33``, ``s33 + 1``, ``Max(1, s33)``) evaluated with ``values``. Raises ValueError for
    anything else (an unknown symbol or function)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            return _CALLS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(expr)

    return int(ev(ast.parse(expr, mode="eval")))


def _bind(value, values: dict[str, int]):
    if isinstance(value, list):
        return [_bind(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _bind(v, values) for k, v in value.items()}
    if isinstance(value, str) and (m := _SIZE.match(value)) and m.group(2):
        return f"{m.group(1)}[{','.join(str(_size(d, values)) for d in m.group(2).split(','))}]"
    return value


def bound_payload(args: str, run_symbols: str, memo: dict) -> str:
    """A call site's payload (JSON) with its symbolic sizes bound to one graph run's values
    (``run_symbols``: ``s33=8 s34=512``, from the run's NVTX range; :func:`gpudiag.capture.
    inductor_provenance.run_symbols`); the payload as it is when it has no symbols; '' when a symbol
    has no value or an expression cannot be read (no cost rather than a wrong one)."""
    if '"symbols"' not in args:
        return args
    key = ("bound", args, run_symbols)
    if key not in memo:
        values = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", run_symbols or "")}
        payload = json.loads(args)
        try:
            memo[key] = json.dumps({"op": payload["op"], "in": _bind(payload["in"], values),
                                    "out": _bind(payload["out"], values)}, separators=(",", ":"))
        except (ValueError, SyntaxError, TypeError, ZeroDivisionError, RecursionError):
            memo[key] = ""
    return memo[key]


def summarize(kernels: pd.DataFrame, out: pd.DataFrame, provenance: dict | None, top: int = 5) -> dict:
    """Compiled share of kernel time, graphs and runs seen, and the share of compiled kernel time
    whose module came from provenance (``mapped_percent``) or that has any module
    (``module_percent``); ``unmapped_top``: the unmapped compiled kernels with most time (ns).
    Percentages are None when there is no compiled kernel time."""
    dur = kernels["duration_ns"].to_numpy(dtype=float) if not kernels.empty else np.array([])
    inside = out["graph"].to_numpy() >= 0 if len(out) else np.array([], bool)
    compiled_ns = float(dur[inside].sum())
    # compared as pandas columns, not as arrays of Python objects (to_numpy of 1 M texts)
    mapped = inside & out["compiled_mapping"].isin(("name", "order", "coarse")).to_numpy(dtype=bool)
    with_module = inside & out["module"].fillna("").ne("").to_numpy(dtype=bool)
    unmapped = pd.Series(dur[inside & ~mapped], index=kernels["name"][inside & ~mapped].to_numpy())

    def pct(mask) -> float | None:
        return round(100 * float(dur[mask].sum()) / compiled_ns, 2) if compiled_ns else None

    graphs = (provenance or {}).get("graphs") or {}
    warnings = list((provenance or {}).get("warnings") or [])
    if inside.any() and not graphs:
        warnings.append("compiled graph runs found but no Inductor provenance was recorded: "
                        "their kernels keep the module around the compiled call")
    return {
        "graphs": int(out.loc[inside, "graph"].nunique()) if inside.any() else 0,
        "graphs_recorded": len(graphs),
        "compiled_kernel_ns": compiled_ns,
        "compiled_percent_of_kernel_time": round(100 * compiled_ns / float(dur.sum()), 2) if dur.sum() else None,
        "mapped_percent": pct(mapped),
        "coarse_percent": pct(inside & (out["compiled_mapping"].to_numpy() == "coarse")),
        "module_percent": pct(with_module),
        "unmapped_top": [{"name": str(n), "ns": float(v)}
                         for n, v in unmapped.groupby(level=0).sum().nlargest(top).items()],
        "warnings": warnings,
    }


def measured_summary(compiled: dict, kernels: pd.DataFrame, attribution: pd.DataFrame, measured_ids: set,
                                status: ScriptStatus | dict | None) -> dict:
    """The compiled-graph summary's shares (compiled share of kernel time, mapped, coarse, with a
    module, the unmapped kernels) over the measured steps, as every other statistic of the report.
    Over the whole capture, the warm-up's compilation counts: under max-autotune, Inductor's
    benchmarking (its L2-flushing fills and candidate kernels, 1.4 s of a BERT capture on the
    H100) made the module attribution look like 47.7 % (docs/workload_zoo.md). The graph counts
    and warnings stay the whole capture's."""
    if not compiled["graphs"]:
        return compiled
    if not measured_ids:
        return {**compiled, "statistics": "whole capture"}
    sel = attribution["step"].isin(measured_ids).to_numpy()
    steady = summarize(kernels[sel], attribution[sel], (ScriptStatus.of(status) or ScriptStatus()).inductor_provenance)
    keep = ("graphs", "graphs_recorded", "warnings")
    return {**compiled, **{key: v for key, v in steady.items() if key not in keep}, "statistics": "measured steps"}
