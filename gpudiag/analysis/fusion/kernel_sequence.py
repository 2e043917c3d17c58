"""Fusion candidates from the kernel sequence alone, for exports without gpudiag's op ranges (a
colleague's plain ``nsys`` capture, ``gpudiag profile --no-op-ranges``): lower confidence than the
op data flow of :mod:`gpudiag.analysis.fusion.dataflow`, and flagged so (``source: "kernel_sequence"``,
``confidence: "low"``).

Model (issue 11, part 2):

- **Runs.** Per measured step and stream, kernels in GPU start order. A run is a maximal sequence of
  at least two consecutive memory-bound kernels (``kernel_class`` bandwidth or overhead,
  :mod:`gpudiag.analysis.roofline.classify`). It ends at a GEMM, convolution or attention kernel
  (:data:`~gpudiag.analysis.attribution.families.CONTRACTION_FAMILIES`, whatever its class: a small GEMM can be
  classified bandwidth-bound and is still no element-wise op), at an optimizer kernel (already a
  multi-tensor kernel; GD-FUSED-OPTIMIZER covers it), and at a library's internal kernel (cuDNN's
  layout transforms, cuBLAS/CUTLASS helpers, NCCL), which belongs to the library call beside it.
  Copies and memsets between kernels do not end a run.
- **Groups.** Runs with the same kernel names and launch configurations (grid and block), in order,
  are one candidate: an eager model launches the same run once per layer, so occurrences per step
  count the layers. Occurrences per step = runs over all measured steps / measured steps.
- **Bytes per kernel, estimated without shapes** (``bytes_method`` names the estimate of the run's
  largest member): for ATen's element-wise kernels the launch configuration gives the elements
  (``elementwise_kernel<nt, vt>``: grid x nt x vt; ``unrolled_elementwise_kernel``: grid x block x 4,
  ATen's thread_work_size; ``vectorized_elementwise_kernel``: grid x block x 8, the elements per thread
  of PyTorch 2.11's vectorized path, checked against the recorded shapes in
  tests/analysis/fusion/test_kernel_sequence.py), times the operands (ATen's ``std::array<char *, N>`` of output and
  input pointers; 2 if the name has none): one of the narrowest dtype named in the template
  arguments, the others of the widest (4 bytes if none is named): ``launch_config``. That, and any
  other kernel's estimate, is capped at the kernel's median duration at peak bandwidth, which no
  kernel can exceed; a kernel without a launch-config estimate gets that bound: ``time_at_peak``.
- **Fused floor** = the largest member's bytes at peak bandwidth + one launch
  (``DevicePeaks.launch_overhead_ns``): a fused kernel still reads the run's inputs and writes its
  output once, and an element-wise chain's largest member moves about that much. Where the largest
  member moves only intermediates the floor is too high (saving underestimated); where the fused
  kernel needs several inputs or outputs of that size (a residual add and a norm) it is too low.
  Without a known peak bandwidth, the floor is the longest member's time + one launch.
- **Saving per step** = max(median run time - floor, 0) x occurrences per step (GPU time).

Why lower confidence: consecutive kernels need not consume each other's outputs (an autocast weight
cast launched before its GEMM joins the run before it), and bytes are estimates, not shapes.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analysis.roofline.classify import CONFIG_COLUMNS
from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES, kernel_label, per_distinct
from gpudiag.analysis.roofline.peaks import DevicePeaks

# Kernels that end a run although memory-bound: library internals of the call beside them (cuDNN's
# nchwToNhwc/nhwcToNchw transforms around an NCHW convolution, cuBLAS/CUTLASS split-K helpers) and
# collectives, which no element-wise fusion can absorb.
LIBRARY_INTERNAL = re.compile(r"cudnn|cublas|cutlass|nccl", re.IGNORECASE)
BREAKING_FAMILIES = CONTRACTION_FAMILIES | {"optimizer"}
# Families whose kernels Inductor (torch.compile) generates itself: element-wise, reductions, norms,
# softmax, copies and layout changes (its pointwise/reduction lowerings).
COMPILE_FUSABLE_FAMILIES = frozenset({"elementwise", "reduce", "norm", "softmax", "copy"})

# Reference kernels recognized from kernel names: per pattern, one regex per consecutive kernel of
# the run (first match wins, the more specific first). Only chains whose kernels name what they
# compute clearly (ATen's functors); every name is a registry kernel (a test checks it).
KERNEL_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # GPT-2's tanh GELU: 0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³)))
    ("bias_gelu", (r"pow_tensor_scalar", r"MulFunctor", r"_add\b|AddFunctor", r"MulFunctor", r"\btanh_kernel",
                   r"_add\b|AddFunctor", r"MulFunctor")),
    # LLaMA-style RMSNorm: x.pow(2).mean(-1) + eps, rsqrt, x * rstd
    ("rms_norm", (r"pow_tensor_scalar", r"MeanOps", r"_add\b|AddFunctor", r"\brsqrt_kernel", r"MulFunctor")),
    ("cross_entropy", (r"LogSoftMaxForwardEpilogue", r"nll_loss_forward")),
    ("cross_entropy", (r"nll_loss_backward", r"LogSoftMaxBackwardEpilogue")),
    ("swiglu", (r"\bsilu_kernel\b", r"MulFunctor")),
    ("geglu", (r"GeluCUDAKernelImpl", r"MulFunctor")),
    ("bias_gelu", (r"_add\b|AddFunctor", r"GeluCUDAKernelImpl")),
    ("add_layer_norm", (r"_add\b|AddFunctor", r"\bvectorized_layer_norm_kernel\b|\blayer_norm_kernel\b")),
)
_KERNEL_PATTERNS = [(ref, [re.compile(p) for p in pats]) for ref, pats in KERNEL_PATTERNS]

# ATen's element-wise launchers: elements per thread (None: read from the template, vt).
_ELEMENTWISE = re.compile(r"at::native::(vectorized_elementwise_kernel|unrolled_elementwise_kernel|elementwise_kernel)<")
_NT_VT = re.compile(r"elementwise_kernel<\(int\)(\d+), \(int\)(\d+),")
_ITEMS_PER_THREAD = {"vectorized_elementwise_kernel": 8, "unrolled_elementwise_kernel": 4}
_OPERANDS = re.compile(r"std::array<char \*, \(unsigned long\)(\d+)>")  # outputs + inputs
_CAST = re.compile(r"\((?:unsigned )?(?:int|long|bool|char)\)-?\d+")  # template value arguments: (int)4, (bool)0
_DTYPES = ((re.compile(r"\b(?:c10::)?(?:BFloat16|Half)\b|\bbfloat16|__half|__nv_bfloat16"), 2),
           (re.compile(r"\bfloat\b"), 4), (re.compile(r"\b(?:double|long|int64_t)\b"), 8))


def launch_config_bytes(name: str, grid_x: float, block_x: float) -> float | None:
    """Bytes one ATen element-wise kernel moves, from its launch configuration (see the module
    docstring): elements x ((operands - 1) x the widest + the narrowest itemsize named); None for any other kernel or a
    configuration it cannot read. Uncapped: callers cap it at the duration at peak bandwidth."""
    m = _ELEMENTWISE.search(name or "")
    if not m or not (grid_x > 0 and block_x > 0):
        return None
    if m.group(1) == "elementwise_kernel":
        nt_vt = _NT_VT.search(name)
        if not nt_vt:
            return None
        elements = grid_x * int(nt_vt.group(1)) * int(nt_vt.group(2))
    else:
        elements = grid_x * block_x * _ITEMS_PER_THREAD[m.group(1)]
    # the template arguments only: the trailing parameter list names index types, not data
    operands = _OPERANDS.search(name)
    operands = int(operands.group(1)) if operands else 2
    template = _CAST.sub("", re.sub(r"\([^()]*\)$", "", name))
    sizes = [size for pattern, size in _DTYPES if pattern.search(template)] or [4]
    return float(elements * ((operands - 1) * max(sizes) + min(sizes)))


def estimated_bytes(configs: pd.DataFrame, bandwidth: float) -> pd.DataFrame:
    """Per launch configuration (columns: name, grid_x, block_x, duration_ns = its median, ns):
    ``bytes`` and ``bytes_method`` (``launch_config`` or ``time_at_peak``, module docstring), the
    launch-config estimate capped at duration x ``bandwidth`` (bytes/s). NaN bytes without a bandwidth."""
    at_peak = configs["duration_ns"].to_numpy(dtype=float) * 1e-9 * (bandwidth or np.nan)
    by_launch = np.array([launch_config_bytes(n, float(gx or 0), float(bx or 0)) or np.nan
                          for n, gx, bx in zip(configs["name"], configs["grid_x"], configs["block_x"])], dtype=float)
    use_launch = np.isfinite(by_launch) & ~(by_launch > at_peak)
    return pd.DataFrame({"bytes": np.where(use_launch, by_launch, at_peak),
                         "bytes_method": np.where(use_launch, "launch_config", "time_at_peak")}, index=configs.index)


def kernel_runs(kernels: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """The members of every run (module docstring) in ``kernels`` (columns: step, stream_id,
    start_ns, duration_ns, name, kernel_class, family, and CONFIG_COLUMNS): the member rows, in run
    order, with ``run`` (an id per run), ``config`` (an id per launch configuration) and ``key`` (the
    run's configuration sequence, as a string). Runs of one kernel are left out. ``columns``: the
    columns of ``kernels`` the members keep (all by default; most kernels of a bandwidth-bound
    capture are members, and each column kept is copied for them)."""
    # The runs are found on a few columns (the names as integer codes) with each row's position;
    # the members' rows of ``kernels`` are copied once at the end (a row filter of the kernel frame
    # copies every column, the names included: 22 % of a 1 M-kernel foreign report's main thread).
    names = kernels["name"]
    internal = per_distinct(names.fillna(""), lambda n: bool(LIBRARY_INTERNAL.search(n)), False, bool)
    member = ((kernels["kernel_class"].isin(["bandwidth", "overhead"]) & ~kernels["family"].isin(BREAKING_FAMILIES))
              .to_numpy() & ~internal)
    # a name's code stands for the name: the same groups, numbered in the same order (NULL: -1)
    k = kernels[["step", "stream_id", "start_ns", *(c for c in CONFIG_COLUMNS if c != "name"),
                 *(["config_key"] if "config_key" in kernels else [])]].assign(
        name_code=pd.factorize(names)[0], member=member, row=np.arange(len(kernels)),
    ).sort_values(["step", "stream_id", "start_ns"], kind="stable")
    config = _config_ids(k)
    member = k["member"].to_numpy()
    same_place = ((k["step"].to_numpy()[1:] == k["step"].to_numpy()[:-1])
                  & (k["stream_id"].to_numpy()[1:] == k["stream_id"].to_numpy()[:-1]))
    continues = np.concatenate([[False], member[:-1] & same_place])
    run = np.cumsum(member & ~continues)
    rows, config, run = k["row"].to_numpy()[member], config[member], run[member]
    sizes = _run_sizes(run)
    keep = np.repeat(sizes >= 2, sizes)
    rows, config, run, sizes = rows[keep], config[keep], run[keep], sizes[sizes >= 2]
    members = (kernels if columns is None else kernels[columns]).iloc[rows].assign(config=config, run=run)
    members["key"] = _run_keys(config, sizes)
    return members


def _config_ids(k: pd.DataFrame) -> np.ndarray:
    """Per row of ``k`` (columns name_code and CONFIG_COLUMNS' others, optionally classify's
    ``config_key``): an id per launch configuration, numbered in order of first appearance, a NULL
    being -1 (``groupby(..., sort=False).ngroup()`` of the columns with NULL as -1). Where ``k`` has
    the classification's ``config_key`` (the same configurations, a NULL a value of its own) and no
    column holds -1, that key factorized gives the same ids without the groupby of seven columns
    (5 M kernels: 1.0 s; docs/scale.md)."""
    config_columns = ["name_code" if c == "name" else c for c in CONFIG_COLUMNS]
    numeric = [c for c in config_columns if c != "name_code"]
    if "config_key" in k and not (k[numeric] == -1).to_numpy().any():
        return pd.factorize(k["config_key"].to_numpy())[0]
    return k[config_columns].fillna(-1).groupby(config_columns, sort=False).ngroup().to_numpy()


def _run_keys(config: np.ndarray, sizes: np.ndarray) -> pd.Categorical:
    """Per member row: its run's configuration sequence as a string (the config ids joined by
    spaces), a Categorical whose categories are the distinct sequences in order of first run.

    ``config``: the members' config ids, runs contiguous; ``sizes``: the runs' lengths. Runs repeat
    (one per layer and step): the sequences are compared as integer rows per run length and only the
    distinct ones are joined into text (a join per run and a per-row text column took 0.9 s of a
    1 M-kernel foreign report)."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    sequence = np.empty(len(sizes), dtype=np.int64)  # per run: an id of its sequence, unique over lengths
    offset = 0
    for length in np.unique(sizes).tolist():  # a few dozen distinct run lengths
        of_length = np.flatnonzero(sizes == length)
        rows = np.ascontiguousarray(config[starts[of_length, None] + np.arange(length)], dtype=np.int64)
        _, inverse = np.unique(rows.view(np.dtype((np.void, 8 * length))).ravel(), return_inverse=True)
        sequence[of_length] = offset + inverse.ravel()
        offset += int(inverse.max()) + 1
    codes = pd.factorize(sequence)[0]  # numbered in order of first run
    first = np.unique(codes, return_index=True)[1]  # per sequence: its first run
    text = [" ".join(map(str, config[a:a + n].tolist())) for a, n in zip(starts[first].tolist(), sizes[first].tolist())]
    return pd.Categorical.from_codes(np.repeat(codes, sizes), categories=pd.Index(text, dtype=object))


def _run_sizes(run: np.ndarray) -> np.ndarray:
    """The lengths of the blocks of equal consecutive values of ``run`` (a run's rows are contiguous)."""
    starts = np.flatnonzero(np.concatenate([[True], run[1:] != run[:-1]])) if len(run) else np.array([], dtype=np.int64)
    return np.diff(np.concatenate([starts, [len(run)]])).astype(np.int64)


def step_label(name: str, short_name: str | None) -> str:
    """A run member as the candidate's ``ops`` list names it: ATen's generic launchers by what they
    compute and their dtype (``pow_tensor_scalar_kernel_impl · fp32``, from
    :func:`~gpudiag.analysis.attribution.families.kernel_label` without the launcher's name), other kernels by
    their label (``batch_norm_collect_statistics_kernel``)."""
    parts = kernel_label(name, short_name).split(" · ")
    return " · ".join(parts[1:]) if len(parts) == 3 else " · ".join(parts)


def _reference(names: list[str]) -> str | None:
    """The first reference kernel whose pattern matches consecutive kernels of the run."""
    for ref, patterns in _KERNEL_PATTERNS:
        for start in range(len(names) - len(patterns) + 1):
            if all(p.search(n) for p, n in zip(patterns, names[start:start + len(patterns)])):
                return ref
    return None


# The members' columns the candidates read (per configuration, per run): the others of the kernel
# frame are not copied for every member (5 M kernels: 0.2 GB at the report's peak, docs/scale.md)
MEMBER_COLUMNS = ["name", "short_name", "family", "grid_x", "grid_y", "grid_z", "block_x", "duration_ns", "module"]


def kernel_sequence_candidates(kernels: pd.DataFrame, peaks: DevicePeaks, n_steps: int,
                               top: int | None = 10) -> list[dict]:
    """Fusion candidates from the measured steps' kernels (``kernels``: columns of
    :func:`kernel_runs` plus short_name and, optionally, module), best first, as plain dicts with the
    keys of :class:`gpudiag.analysis.fusion.dataflow.Candidate` (``ops``: each kernel's :func:`step_label`;
    ``example_shapes`` empty; ``external_bytes``:
    the floor's bytes) plus ``source`` ("kernel_sequence"), ``confidence`` ("low"), ``bytes_method``
    and ``grids`` (each member's grid). Times in ns, bytes in bytes; ``n_steps`` measured steps in
    ``kernels`` (0 gives []). The ``top`` first; all with None."""
    if not n_steps or kernels.empty:
        return []
    # the columns read here and by kernel_runs: the members' copy leaves the kernel frame's others out
    k = kernels if "module" in kernels else kernels.assign(module="")
    members = kernel_runs(k[list(dict.fromkeys(["step", "stream_id", "start_ns", "duration_ns", "kernel_class", "family",
                                                "short_name", "module", *CONFIG_COLUMNS,
                                                *(["config_key"] if "config_key" in k else [])]))],
                          columns=MEMBER_COLUMNS)
    if members.empty:
        return []
    per_config = members.groupby("config").agg(name=("name", "first"), short_name=("short_name", "first"),
                                                family=("family", "first"), grid_x=("grid_x", "first"),
                                                grid_y=("grid_y", "first"), grid_z=("grid_z", "first"),
                                                block_x=("block_x", "first"), duration_ns=("duration_ns", "median"))
    per_config = per_config.join(estimated_bytes(per_config, peaks.bandwidth))
    # per run: its sequence's code (codes number the sequences in order of first run, as a
    # groupby of the text keys with sort=False would), time and module
    runs = members.assign(key=members["key"].cat.codes).groupby("run", sort=False).agg(
        key=("key", "first"), ns=("duration_ns", "sum"), module=("module", "first"))
    out = []
    for code, group in runs.groupby("key", sort=False):
        key = members["key"].cat.categories[code]
        configs = per_config.loc[[int(c) for c in key.split()]].reset_index(drop=True)
        largest = int(np.argmax(configs["bytes"].fillna(-1.0).to_numpy()))
        if peaks.bandwidth:
            floor = float(configs.at[largest, "bytes"]) / peaks.bandwidth * 1e9 + peaks.launch_overhead_ns
        else:
            floor = float(configs["duration_ns"].max()) + peaks.launch_overhead_ns
        chain_ns = float(group["ns"].median())
        occurrences = len(group) / n_steps
        # the distinct modules first: a run per layer and step repeats a few names
        modules = sorted({m for m in group["module"].unique() if isinstance(m, str) and m})
        out.append({
            "ops": [step_label(n, s) for n, s in zip(configs["name"], configs["short_name"])],
            "occurrences_per_step": int(occurrences) if occurrences == int(occurrences) else round(occurrences, 2),
            "modules": modules[:8], "chain_ns": chain_ns, "fused_floor_ns": floor,
            "saving_ns_per_step": max(chain_ns - floor, 0.0) * occurrences,
            "external_bytes": float(configs.at[largest, "bytes"]) if peaks.bandwidth else None,
            "kernels_per_occurrence": len(configs),
            "compile_fusable": bool(configs["family"].isin(COMPILE_FUSABLE_FAMILIES).all()),
            "reference_kernel": _reference(configs["name"].fillna("").tolist()),
            "example_shapes": [],
            "source": "kernel_sequence", "confidence": "low",
            "bytes_method": str(configs.at[largest, "bytes_method"]) if peaks.bandwidth else "time_at_peak",
            "families": {str(f): int(c) for f, c in configs["family"].fillna("other").value_counts().items()},
            "grids": [[int(v) if pd.notna(v) else None for v in g]
                      for g in configs[["grid_x", "grid_y", "grid_z"]].itertuples(index=False)],
        })
    return sorted(out, key=lambda c: -c["saving_ns_per_step"])[:top]
