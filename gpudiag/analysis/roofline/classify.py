"""Per-kernel classification: compute-, bandwidth- or overhead-bound, with its evidence.

This is the first cut, kept behind one function (:func:`classify`) so the roofline issue can
replace it. Rules, in order:

1. overhead-bound (design.md: "kernels too small for either roof to matter (duration near the
   launch latency, grid under one wave)"): shorter than one eager op launch on the host
   (``DevicePeaks.launch_overhead_ns``, measured, docs/notes/measurements.md) with fewer blocks
   than SMs (under one wave at one block per SM, a lower bound that ignores occupancy), or shorter
   than half a launch whatever its grid (our choice: then launching costs the host twice the
   kernel's own time, so eager mode cannot keep the GPU busy).
2. with Nsight Compute measurements of the same kernel name and launch configuration (evidence
   ``ncu``): measured FLOPs (all precisions, tensor cores included) and DRAM bytes give the
   arithmetic intensity, held against the ridge of the math path the kernel used. A row goes to the
   launches of its configuration it measured, aligned in order and by duration
   (:mod:`gpudiag.analysis.roofline.ncu_pairing`); a launch no row measured keeps its other evidence.
   With shapes (evidence ``shapes``): the FLOPs and bytes of the aten op that launched the kernel
   on the detail step (:mod:`gpudiag.analysis.roofline.costmodel`), or of the contraction its compiled
   graph's call site recorded (Inductor's traced shapes, :func:`_op_calls`), shared among that op call's
   kernels in proportion to their durations (a contraction's or attention op's FLOPs and bytes among its
   GEMM, convolution and attention kernels only), give the arithmetic intensity; at or above the ridge point of
   the op's math path it is compute-bound, below it bandwidth-bound. Other instances of the same
   kernel name and launch configuration inherit the detail step's numbers. The roof is fp32's
   where the kernel's name shows SIMT execution (a bf16 convolution cuDNN runs as an ``sgemm``),
   whatever the op's precision (``math_path``, which the precision rules read). The part of a
   contraction's (or attention op's) output that :data:`L2_SHARE` of the L2 (the export's
   ``l2CacheSize``) holds beside its inputs is not DRAM traffic of its kernel: the L2 is write-back and that part is still in it
   when the kernel ends, as Nsight Compute counts it (a 4096x1024x256 bf16 GEMM on the H200: 8.9 MB
   of DRAM bytes, its inputs, against 11.0 MB with its 2.1 MB output; tests/fixtures/roofline48/
   decoder). Larger outputs are partly written back: GPT-2's 37.7 MB attention scores beside 11.8
   MB of inputs, ncu 36.2 MB in all; EfficientNet's 57.8 MB 1x1 convolution output beside 9.6 MB,
   ncu 42.7 MB (the whole L2 as the share took both for staying; half of it fits the fixtures). Other
   ops keep their outputs: their class does not move with it, and the fusion ranking counts the
   bytes a fused kernel would not write. A GEMM kernel computes K rounded up to the K step its
   name states (:func:`gpudiag.analysis.roofline.tiles.gemm_k_step`), and is given those FLOPs, as
   Nsight Compute counts them.
3. otherwise (evidence ``heuristic``): GEMM, convolution and attention kernels are compute-bound,
   everything else bandwidth-bound, except a GEMM whose name states a tile with a side under 64,
   a depthwise convolution and a product of eager attention found next to its softmax, all
   bandwidth-bound (:mod:`gpudiag.analysis.roofline.tiles`,
   :mod:`gpudiag.analysis.roofline.attention_products`). Such rows say what the class rests on
   (``basis``: family, small tile, large tile, no tile, Triton template, depthwise, attention product;
   ``tile_side``) and how often that basis agreed with Nsight Compute on the committed fixtures
   (``confidence``).

Collective-library kernels (family ``communication``, :mod:`gpudiag.analysis.attribution.families`) are class
``communication`` whatever their duration or shapes: they are outside the roofline (their time is
set by the links and by waiting for the other ranks), so they get no FLOPs, bytes or efficiency.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analysis.roofline.attention_products import attention_products
from gpudiag.analysis.roofline.costmodel import CONTRACTION_OPS, SDPA_PREFIXES, op_cost
from gpudiag.analysis.attribution.families import COMMUNICATION, CONTRACTION_FAMILIES, families, per_distinct
from gpudiag.analysis.roofline.kernel_precision import simt_math_path
from gpudiag.analysis.roofline.ncu_pairing import pair_rows
from gpudiag.analysis.roofline.peaks import DevicePeaks
from gpudiag.analysis.roofline.tiles import BASES, BASIS_CONFIDENCE, gemm_k_step, heuristic_basis

# The share of the L2 a kernel's inputs and output may stay in when it ends (module docstring; fitted on
# the issue 48 fixtures, docs/roofline_gemm.md: a half, as the H100/H200 L2 is two partitions)
L2_SHARE = 0.5
CONFIG_COLUMNS = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
CLASSES = ["overhead", "compute", "bandwidth"]  # kernel_class, by code
EVIDENCE = ["heuristic", "shapes", "ncu"]  # evidence, by code
_TEXT = pd.Series(["x"]).dtype  # the dtype pandas gives a column of text


def _text(labels: list[str], codes: np.ndarray) -> pd.api.extensions.ExtensionArray | np.ndarray:
    """``labels[codes]`` as a text column of pandas' own text dtype, built in Arrow where pandas
    keeps text there (1 M rows: 0.08 s, where inferring it from Python strings took 0.35 s)."""
    if getattr(_TEXT, "storage", None) == "pyarrow":
        import pyarrow as pa

        return pd.array(pa.array(labels, pa.large_string()).take(pa.array(codes)), dtype=_TEXT)
    return np.asarray(labels, dtype=object)[codes]


def _config_key(kernels: pd.DataFrame) -> pd.Series:
    """One integer per distinct kernel name and launch configuration, numbered in order of first
    appearance, a NULL being a value of its own (what ``groupby(CONFIG_COLUMNS, sort=False,
    dropna=False).ngroup()`` gives), found by factorizing one int64 code per row: a groupby of seven
    columns took 0.25 s of 1 M kernels."""
    name = kernels["name"]
    key, radix = np.zeros(len(kernels), dtype=np.int64), 1
    for c in CONFIG_COLUMNS:
        if c == "name" and isinstance(name.dtype, pd.CategoricalDtype):  # names as codes (ingest's)
            # a NULL name's code, -1, is a value of its own: the name comes first, so the code of a
            # row stays one to one with its configuration
            codes, size = name.cat.codes.to_numpy(np.int64), max(len(name.cat.categories), 1)
        else:
            codes, uniques = pd.factorize(kernels[c], use_na_sentinel=False)
            size = max(len(uniques), 1)
        if radix * size >= 2**62:  # keep the mixed-radix code inside int64
            key, seen = pd.factorize(key)
            key, radix = key.astype(np.int64), len(seen)
        key, radix = key * size + codes, radix * size
    return pd.Series(pd.factorize(key)[0].astype(np.int64), index=kernels.index)


def _op_calls(attribution: pd.DataFrame) -> pd.DataFrame:
    """op, op_args and op_call per kernel: the eager op call that launched it (op ranges), else the
    contraction of its compiled graph's call site (``compiled_op*``, :func:`gpudiag.analysis.
    attribution.compiled.attribute_compiled`), numbered after the eager calls."""
    calls = attribution[["op", "op_args", "op_call"]]
    if "compiled_op_call" not in attribution:
        return calls
    compiled = (attribution["compiled_op_call"].to_numpy() >= 0) & (calls["op_call"].to_numpy() < 0)
    if not compiled.any():
        return calls
    calls = calls.astype({"op": object, "op_args": object})  # copies: the attribution table is not changed
    first = int(calls["op_call"].max()) + 1 if len(calls) else 0
    calls.loc[compiled, "op"] = attribution.loc[compiled, "compiled_op"].astype(object).to_numpy()
    calls.loc[compiled, "op_args"] = attribution.loc[compiled, "compiled_op_args"].astype(object).to_numpy()
    calls.loc[compiled, "op_call"] = first + attribution.loc[compiled, "compiled_op_call"].to_numpy()
    return calls


def _shape_costs(kernels: pd.DataFrame, attribution: pd.DataFrame, family: pd.Series,
                 l2_bytes: float = float("nan")) -> pd.DataFrame:
    """flop, bytes and math_path per kernel instance that an op call with recorded shapes launched.
    An op call's bytes are shared among its kernels by duration; a contraction's or attention op's FLOPs
    and bytes go to its contraction-family kernels only (a split-K reduction or a cast launched by the same call does
    not do the multiply-adds, and the operands are the GEMM's traffic), the FLOPs times the padding of
    K to the kernel's K step. Of a contraction's or attention op's output, the part that ``L2_SHARE`` x
    ``l2_bytes`` holds beside its inputs is left out of its bytes (module docstring; NaN: the L2 size
    is unknown, every output counts)."""
    # .array: the text columns as they are, not as Python objects (to_numpy)
    k = pd.DataFrame({"duration_ns": kernels["duration_ns"].to_numpy(), "op": attribution["op"].array,
                      "op_args": attribution["op_args"].array, "op_call": attribution["op_call"].to_numpy(),
                      "contraction": family.isin(CONTRACTION_FAMILIES).to_numpy()})
    k = k[k["op_call"] >= 0]
    if k.empty:
        return pd.DataFrame(columns=["flop", "bytes", "math_path"])
    calls = k.drop_duplicates("op_call")[["op_call", "op", "op_args"]]
    texts = calls[["op", "op_args"]].drop_duplicates()
    costs = [op_cost(o, a) for o, a in texts.itertuples(index=False)]  # once per distinct call text
    texts = texts.assign(k=[c.k if c else np.nan for c in costs])
    out_bytes = np.array([c.out_bytes if c else 0.0 for c in costs])
    op_bytes = np.array([c.bytes if c else np.nan for c in costs])
    # the part of a contraction's output that the L2 still holds when its kernel ends (module docstring)
    kept = np.clip(L2_SHARE * l2_bytes - (op_bytes - out_bytes), 0.0, out_bytes) if np.isfinite(l2_bytes) else 0.0
    tensor_core_op = texts["op"].isin(CONTRACTION_OPS) | texts["op"].astype(str).str.startswith(SDPA_PREFIXES)
    kept = np.where(tensor_core_op.to_numpy(), kept, 0.0)
    texts = texts.assign(flop=[c.flop if c else np.nan for c in costs], bytes=op_bytes - kept,
                         math_path=[c.math_path if c else None for c in costs])
    per_call = calls.merge(texts, on=["op", "op_args"]).dropna(subset=["math_path"]).set_index("op_call")
    share = k["duration_ns"] / k.groupby("op_call")["duration_ns"].transform("sum").replace(0, np.nan)
    joined = per_call.reindex(k["op_call"].to_numpy())
    joined.index = k.index
    flop_weight = k["duration_ns"].where(k["contraction"], 0.0)
    call_has_contraction = flop_weight.groupby(k["op_call"]).transform("sum") > 0
    # a matmul, convolution or attention op: its multiply-adds are done by its contraction kernels
    contraction_call = call_has_contraction & (joined["op"].isin(CONTRACTION_OPS)
                                               | joined["op"].astype(str).str.startswith(SDPA_PREFIXES))
    flop_share = (flop_weight / flop_weight.groupby(k["op_call"]).transform("sum").replace(0, np.nan)).where(
        contraction_call, share)
    # the kernel computes K rounded up to its tile's K step (tiles.gemm_k_step): so many FLOPs it executes
    step = (per_distinct(kernels["name"].reset_index(drop=True), gemm_k_step, np.nan, float)[k.index.to_numpy()]
            if "name" in kernels else np.full(len(k), np.nan))
    padded = np.where(np.isfinite(step) & (joined["k"].to_numpy() > 0),
                      np.ceil(joined["k"].to_numpy() / step) * step / joined["k"].to_numpy(), 1.0)
    # a contraction's operands are its GEMM's traffic, as its FLOPs are: a split-K reduction launched
    # by the same call gets neither (classed by its name), nor does a cast, nor an attention backward's
    # dot(dO, O) or dQ cast (families.py)
    byte_share = flop_share.where(contraction_call, share)
    return pd.DataFrame({"flop": joined["flop"] * flop_share.fillna(0.0) * padded,
                         "bytes": joined["bytes"] * byte_share.fillna(1.0), "math_path": joined["math_path"]}).dropna(subset=["math_path"])


def _instance_index(config_key: pd.Series, step: pd.Series) -> pd.MultiIndex:
    """(config_key, ordinal) per kernel: the n-th launch of a configuration within its step. Steps of
    an eager training loop launch the same sequence, so the n-th launch in any step does the same
    work as the n-th launch in the detail step (a launch configuration alone does not pin down the
    work: a GEMM's grid ignores K)."""
    cfg = config_key.to_numpy(np.int64)
    step_code = pd.factorize(step.to_numpy())[0].astype(np.int64)
    # one int64 key per (step, config): a groupby of one column, not two (0.11 s of 1 M kernels)
    ordinal = pd.Series(cfg).groupby(step_code * (int(cfg.max(initial=0)) + 1) + cfg).cumcount()
    outside = step_code < 0  # a NULL step: no ordinal (NaN), as a groupby of the two columns gives
    if outside.any():
        ordinal = ordinal.where(~outside)
    return pd.MultiIndex.from_arrays([cfg, ordinal.to_numpy()])


def _spread(values: pd.DataFrame, source_index: pd.MultiIndex, target_index: pd.MultiIndex,
            config_key: pd.Series) -> pd.DataFrame:
    """Give every kernel the values (flop, bytes, math_path) of the detail-step launch with the same
    (config, ordinal); launches with no such partner get the configuration's median."""
    by_instance = values.set_axis(source_index)
    by_instance = by_instance[~by_instance.index.duplicated()]
    exact = by_instance.reindex(target_index)
    medians = values.assign(config_key=source_index.get_level_values(0)).groupby("config_key").agg(
        flop=("flop", "median"), bytes=("bytes", "median"), math_path=("math_path", "first"))
    fallback = medians.reindex(config_key.to_numpy())
    exact.index = fallback.index = config_key.index
    return exact.where(exact["math_path"].notna(), fallback)


def _ncu_rows_by_instance(ncu: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ncu measurements as (flop, bytes, math_path) with their config columns; rows without the
    roofline counters (finite FLOPs and DRAM bytes) are dropped."""
    from gpudiag.sources.ncu import math_path

    measured = ncu[np.isfinite(ncu["flop"].astype(float)) & np.isfinite(ncu["dram_bytes"].astype(float))]
    values = pd.DataFrame({"flop": measured["flop"].astype(float), "bytes": measured["dram_bytes"].astype(float),
                           "math_path": measured.apply(math_path, axis=1) if not measured.empty else pd.Series(dtype=object)})
    return measured, values


def classify(kernels: pd.DataFrame, attribution: pd.DataFrame, peaks: DevicePeaks,
             ncu: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kernel (same order): kernel_id, family, config_key, kernel_class
    (compute/bandwidth/overhead/communication), evidence (ncu/shapes/heuristic), flop, bytes, math_path,
    intensity (FLOP/byte), ridge (FLOP/byte, of the roof the kernel ran on: fp32 for a SIMT-named
    kernel whatever its op's precision), achieved_flop_per_s, achieved_bytes_per_s,
    efficiency (roofline floor / duration; NaN without shapes), tile_side (elements; NaN without a
    tile in the name), basis and confidence (0-1; heuristic rows only, else "" and NaN)."""
    out = pd.DataFrame({"kernel_id": kernels["kernel_id"].to_numpy(), "family": families(kernels["name"]).array,
                        "config_key": _config_key(kernels).to_numpy()})
    dur = kernels["duration_ns"].to_numpy(dtype=float)
    config_key = out["config_key"]
    instance = _instance_index(config_key, attribution["step"])
    cost = _shape_costs(kernels, _op_calls(attribution), out["family"], peaks.l2_bytes)
    out["flop"], out["bytes"], out["math_path"] = np.nan, np.nan, None
    if not cost.empty:
        # Every instance takes the detail step's numbers of the same launch (config, ordinal).
        spread = _spread(cost, instance[cost.index.to_numpy()], instance, config_key)
        out[["flop", "bytes"]] = spread[["flop", "bytes"]].to_numpy()
        out["math_path"] = spread["math_path"].to_numpy()

    # evidence and class as codes into EVIDENCE / CLASSES, turned into text once at the end (_text)
    evidence = np.where(out["math_path"].notna(), 1, 0).astype(np.int8)
    if ncu is not None and not ncu.empty:
        # Measured FLOPs and DRAM bytes win over estimates: each ncu row goes to the launches of its
        # configuration that it measured (ncu_pairing: aligned in order and by duration).
        measured, values = _ncu_rows_by_instance(ncu)
        if not measured.empty:
            keys = kernels[CONFIG_COLUMNS].astype({c: float for c in CONFIG_COLUMNS[1:]}).fillna(-1)
            ncu_keys = measured[CONFIG_COLUMNS].astype({c: float for c in CONFIG_COLUMNS[1:]}).fillna(-1)
            known = keys.assign(config_key=config_key).drop_duplicates(CONFIG_COLUMNS)
            ncu_config = ncu_keys.merge(known, on=CONFIG_COLUMNS, how="left")["config_key"]
            matched = ncu_config.notna().to_numpy()
            if matched.any():
                row_ns = measured["duration_ns"] if "duration_ns" in measured else pd.Series(np.nan, index=measured.index)
                row = pair_rows(config_key.to_numpy(), instance.get_level_values(1).to_numpy(), dur,
                                ncu_config[matched].astype(int).to_numpy(), row_ns[matched].to_numpy(float))
                hit = row >= 0
                paired = values[matched].iloc[row[hit]]
                out.loc[hit, ["flop", "bytes"]] = paired[["flop", "bytes"]].to_numpy()
                out.loc[hit, "math_path"] = paired["math_path"].to_numpy()
                evidence[hit] = 2
    has_shapes = out["math_path"].notna().to_numpy()
    out["intensity"] = out["flop"] / out["bytes"].replace(0, np.nan)
    # The roof is the one the kernel ran on: a bf16 conv cuDNN runs as an sgemm is held to fp32's
    # (math_path stays the op's precision: the precision rules read it).
    roof = simt_math_path(kernels["name"].reset_index(drop=True), out["math_path"].astype(object))
    out["ridge"] = per_distinct(roof, peaks.ridge, np.nan, float)
    out["achieved_flop_per_s"] = out["flop"] / (dur * 1e-9)
    out["achieved_bytes_per_s"] = out["bytes"] / (dur * 1e-9)
    peak_flops = per_distinct(roof, lambda p: peaks.flops.get(p, np.nan), np.nan, float)
    floor_s = np.fmax(out["flop"] / peak_flops, out["bytes"] / (peaks.bandwidth or np.nan))
    out["efficiency"] = floor_s / (dur * 1e-9)

    blocks = (kernels[["grid_x", "grid_y", "grid_z"]].fillna(1).prod(axis=1)).to_numpy()
    launch = peaks.launch_overhead_ns
    overhead = ((dur < launch) & (blocks < max(peaks.sm_count, 1))) | (dur < launch / 2)
    by_roofline = np.where(out["intensity"].to_numpy() >= out["ridge"].to_numpy(), 1, 2)
    heuristic = heuristic_basis(kernels["name"], out["family"],
                                attention_products(kernels, out["family"], config_key))
    by_name = np.where(heuristic["bandwidth"].to_numpy(), 2, 1)
    roofline_known = has_shapes & np.isfinite(out["ridge"].to_numpy()) & np.isfinite(out["intensity"].to_numpy())
    out["kernel_class"] = _text(CLASSES, np.where(overhead, 0, np.where(roofline_known, by_roofline, by_name)))
    out["evidence"] = _text(EVIDENCE, np.where(roofline_known, evidence, 0))
    out["tile_side"] = heuristic["tile_side"].to_numpy()
    by_heuristic = ~roofline_known & ~overhead
    out["basis"] = _text(BASES + [""], np.where(by_heuristic, heuristic["basis"].to_numpy(), len(BASES)))
    out["confidence"] = np.where(by_heuristic, np.asarray(BASIS_CONFIDENCE)[heuristic["basis"].to_numpy()], np.nan)
    comm = (out["family"] == COMMUNICATION).to_numpy()
    if comm.any():  # outside the roofline: no roofline numbers, whatever op launched them
        out.loc[comm, "kernel_class"], out.loc[comm, "evidence"] = COMMUNICATION, "heuristic"
        roof = ["flop", "bytes", "intensity", "ridge", "achieved_flop_per_s", "achieved_bytes_per_s", "efficiency"]
        out.loc[comm, roof] = np.nan
        out.loc[comm, "math_path"] = None
    return out
