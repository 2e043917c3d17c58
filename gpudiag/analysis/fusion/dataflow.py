"""Fusion candidates: groups of memory- or launch-bound op calls that one fused kernel could replace.

On the detail step, the op calls' recorded storage addresses give the data-flow graph: an edge from
the op call that wrote a storage to each op call that read that version of it. A group is a
connected set of op calls that
- launched only bandwidth- or overhead-bound kernels (no GEMM, convolution or attention),
- run on the same stream, in the same scope (a module's forward with its children, or the backward),
- are joined only through intermediates that no GEMM (or other excluded op) also reads, and
- is convex: no member depends on another through an op call outside the group (a block's two
  residual adds have the MLP's GEMMs between them on the data path, so they are two groups),
even when a GEMM runs between members in time (SwiGLU: silu(gate(x)) * up(x), with up_proj's GEMM
between silu and mul). A group of two or more kernel-launching op calls is a candidate. Its fused
floor is one pass over its external bytes (inputs it did not produce, and outputs read after it,
the backward's saved tensors included) at peak bandwidth, plus one launch (the calibrated or
default eager launch cost). Saving per occurrence = the group's kernel time - the floor. Identical
groups (same op sequence and shapes) are merged; candidates are ranked by saving x occurrences per
step, with the module paths where they occur.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from gpudiag.analysis.roofline.costmodel import ITEMSIZE, _TENSOR
from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES
from gpudiag.analysis.roofline.peaks import DevicePeaks

# Ops Inductor (torch.compile) fuses into generated pointwise/reduction kernels: element-wise math,
# reductions, normalizations, softmax, casts, copies and layout changes (PyTorch's inductor lowering
# table covers these aten ops). A chain made only of them is a "use torch.compile" candidate.
INDUCTOR_FUSABLE = re.compile(
    r"^aten::(add|sub|mul|div|pow|tanh|gelu|silu|relu|sigmoid|exp|log|sqrt|rsqrt|neg|abs|where|clamp|maximum|minimum|"
    r"_to_copy|copy_|clone|contiguous|permute|transpose|view|reshape|roll|cat|sum|mean|amax|var|native_layer_norm|"
    r"layer_norm|_softmax|softmax|_log_softmax|dropout|native_dropout|masked_fill|fill_|zero_|constant_pad_nd|"
    r"index|slice|select|expand|gelu_backward|silu_backward|threshold_backward|tanh_backward|_softmax_backward_data|"
    r"native_layer_norm_backward|mul_|add_|div_|sub_|slice_backward|cos|sin|ones_like|nll_loss_forward|nll_loss_backward|"
    r"_log_softmax_backward_data|native_batch_norm|cudnn_batch_norm|_native_batch_norm_legit|batch_norm|"
    r"silu_backward|threshold|relu|"
    # Gathers, scatters and the buffers they fill (GNN message passing, embedding bags, MoE dispatch):
    # Inductor lowers index_select/gather/index_add/scatter_add to generated loads and atomic
    # stores fused with their neighbours. Measured on the H200 (docs/trials_proof.md): a GNN step of
    # index_select -> mul -> zeros -> index_add chains took 14.0 ms eager, 3.95 ms compiled.
    r"zeros|new_zeros|zeros_like|empty|new_empty|full|new_full|gather|scatter|scatter_add|scatter_reduce|"
    r"index_select|index_add|index_put|embedding|embedding_dense_backward)(\.|$|_)")

# Pattern signatures of the reference kernels in gpudiag/fused (a regex over the chain's op
# names); only kernels that exist are listed, so a candidate never points at a missing one.
# The first pattern that matches names the kernel, so the more specific ones come first.
REFERENCE_PATTERNS: tuple[tuple[str, str], ...] = (
    # Swin's shifted-window blocks (timm): LayerNorm, roll, pad (a memcpy), window partition; in the
    # backward: the partition's copy, roll back, LayerNorm backward. The roll is required: LayerNorm
    # then a copy without it is any model's `.contiguous()` (unshifted Swin blocks are not matched).
    ("ln_roll_window_partition", r"(aten::_to_copy )?aten::native_layer_norm aten::roll aten::clone"),
    ("ln_roll_window_partition", r"aten::clone aten::roll aten::native_layer_norm_backward"),
    # ... and after attention: window reverse, roll back, DropPath, residual add; in the backward:
    # DropPath's scale, roll, the reverse's copy
    ("window_reverse_roll_add", r"aten::clone (aten::roll )?aten::bernoulli_ aten::div_ aten::mul aten::add"),
    ("window_reverse_roll_add", r"aten::clone aten::roll aten::add"),
    ("window_reverse_roll_add", r"aten::mul aten::roll aten::clone"),
    # attention scores' backward: softmax backward (fp32 under autocast) and the bias gradient's sum
    ("softmax_bias_mask", r"(aten::_to_copy )?aten::_softmax_backward_data (aten::_to_copy )?aten::sum"),
    # attention scores: relative position bias, shift mask, softmax (fp32 under autocast), cast back
    ("softmax_bias_mask", r"aten::add aten::add aten::_softmax( aten::_to_copy)?"),
    ("softmax_bias_mask", r"aten::index aten::clone aten::add aten::_softmax"),  # unshifted: the gathered bias only
    ("bias_dropout_add", r"aten::add aten::native_dropout aten::add"),  # Megatron: bias-free GEMM, bias, dropout, residual
    ("bias_dropout_add", r"aten::bernoulli_ (aten::div_ )?aten::mul aten::add"),  # timm DropPath + residual: drop_path_add
    ("bias_dropout_add", r"aten::native_dropout aten::add"),  # GPT-2 (HF): dropout + residual, the bias inside addmm
    # HF causal-LM loss (ForCausalLMLoss: upcast the logits, pad-shift the labels, log-softmax, NLL):
    # the LM head's logits feed it, so the chunked linear + cross-entropy that never materializes
    # them is the kernel to use (its memory win is the point; the GEMM stays outside the group)
    ("linear_cross_entropy", r"aten::_to_copy aten::constant_pad_nd aten::clone aten::_log_softmax (aten::_to_copy )?aten::nll_loss_forward"),
    ("cross_entropy", r"aten::_log_softmax (aten::_to_copy )?aten::nll_loss_forward"),
    ("cross_entropy", r"aten::nll_loss_backward (aten::_to_copy )?aten::_log_softmax_backward_data"),
    ("bias_gelu", r"aten::pow aten::mul aten::add aten::mul aten::tanh aten::add aten::mul"),  # tanh GELU, e.g. GPT-2
    ("bias_gelu", r"aten::add aten::gelu"),
    # the tanh GELU's backward, as autograd runs it: the tanh branch, then the x³ branch
    ("bias_gelu", r"aten::mul aten::mul (aten::_to_copy )?aten::tanh_backward"),
    ("bias_gelu", r"aten::pow aten::mul aten::mul (aten::_to_copy )?aten::add"),
    ("rms_norm", r"aten::pow aten::mean aten::add aten::rsqrt aten::mul"),  # LLaMA-style hand-written RMSNorm
    # ... and its backward as autograd runs it (HF LlamaRMSNorm, fp32 inside): the weight's and the
    # input's gradient products and sums, then pow's and mean's backward
    ("rms_norm", r"aten::mul aten::mul aten::sum (?:\S+ )*?aten::pow aten::mul aten::mul aten::div"),
    # HF rotary embedding (rotate_half: slice, neg, cat) on q, k: q*cos + rotate_half(q)*sin; the
    # backward: rotate_half's transpose (neg and two slice_backward), summed with the cos branch
    ("rope", r"aten::mul aten::neg aten::cat aten::mul aten::add"),
    ("rope", r"aten::neg aten::slice_backward aten::slice_backward aten::add"),
    # LLaMA's gated MLP, silu(gate) * up: found across up_proj's GEMM by the data flow; backward:
    # the product's two gradients, then silu's
    ("swiglu", r"aten::silu aten::mul"),
    ("swiglu", r"aten::mul aten::mul aten::silu_backward"),
    ("geglu", r"aten::gelu aten::mul"),
    ("add_layer_norm", r"aten::add aten::native_layer_norm"),  # pre-norm residual + LayerNorm
    ("bias_residual_add", r"aten::add aten::add"),  # a bias-free GEMM's bias, then the residual (last: generic)
)

# Patterns with no reference kernel where the advice is torch.compile, which fuses them (Inductor
# decomposes batch norm into reductions and point-wise ops it fuses with the ReLU and the residual
# add): torchvision ResNets' BN + ReLU (+ residual add), forward and backward.
COMPILE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("bn_relu_add", r"aten::(native|cudnn)_batch_norm (aten::(native|cudnn)_batch_norm )?(aten::add_? )?aten::relu_?"),
    ("bn_relu_add", r"(aten::add )?(\S+ )?aten::threshold_backward aten::(native|cudnn)_batch_norm_backward"),
)


@dataclass
class Candidate:
    ops: list[str]
    occurrences_per_step: int
    modules: list[str]
    chain_ns: float  # kernel time of one occurrence
    fused_floor_ns: float
    saving_ns_per_step: float
    external_bytes: float
    kernels_per_occurrence: int
    compile_fusable: bool
    reference_kernel: str | None
    example_shapes: list = field(default_factory=list)
    saved_for_backward: list = field(default_factory=list)  # [{"op", "bytes"}]: intermediates the backward reads
    compile_pattern: str | None = None  # a known pattern with no reference kernel, for which torch.compile is the advice


def _parse(args: str, op: str) -> tuple[dict, set, set]:
    """(storage -> bytes, reads, writes) of an op call from its payload."""
    try:
        payload = json.loads(args)
    except ValueError:
        return {}, set(), set()
    sizes: dict[str, float] = {}

    def walk(value, into: set) -> None:
        if isinstance(value, str):
            m = _TENSOR.match(value)
            if m and m.group(3):
                shape = [int(x) for x in m.group(2).split(",") if x]
                sizes[m.group(3)] = float(np.prod(shape)) * ITEMSIZE.get(m.group(1), 4)
                into.add(m.group(3))
        elif isinstance(value, list):
            for v in value:
                walk(v, into)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v, into)

    reads: set = set()
    writes: set = set()
    inputs = payload.get("in", [])
    walk(inputs, reads)
    walk(payload.get("out"), writes)
    if op.endswith("_") and inputs:
        walk(inputs[0], writes)
    return sizes, reads, writes


def _strip_addresses(value):
    """A recorded argument without its storage addresses (nested lists too: cat/stack inputs)."""
    if isinstance(value, str):
        return re.sub(r"@[0-9a-f]+", "", value)
    if isinstance(value, list):
        return [_strip_addresses(v) for v in value]
    return value


def _op_calls(detail: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel-launching op call of the detail step, in launch order: start, ns (kernel
    time), kernels, op, args, module, phase, stream, eligible (only bandwidth- or overhead-bound
    kernels, none of them a GEMM, convolution or attention)."""
    # the kernels' tests per row, then all/any per call: no Python function per op call (a step has
    # thousands; the lambdas took 1.5 s of a 1 M-kernel report)
    flags = detail[["op_call", "start_ns", "duration_ns", "op", "op_args", "module", "phase", "stream_id"]].assign(
        memory_bound=detail["kernel_class"].isin(["bandwidth", "overhead"]).to_numpy(),
        contraction=detail["family"].isin(CONTRACTION_FAMILIES).to_numpy())
    calls = flags.groupby("op_call").agg(
        start=("start_ns", "min"), ns=("duration_ns", "sum"), kernels=("duration_ns", "size"), op=("op", "first"),
        args=("op_args", "first"), module=("module", "first"), phase=("phase", "first"), stream=("stream_id", "first"),
        memory_bound=("memory_bound", "all"), contraction=("contraction", "any")).sort_values("start").reset_index()
    calls["eligible"] = calls["memory_bound"] & ~calls["contraction"]
    return calls


def _between_calls(op_call: np.ndarray, op_payloads: list[str] | None) -> dict[int, tuple[dict, set, set]]:
    """The op calls without kernels between the first and last kernel-launching one (by op_call, the
    host's order), parsed. Any tensor argument counts as read: a metadata-only op (new_empty, as
    DropPath's) then carries the data flow to what it creates, which DropPath's bernoulli_ -> mul needs."""
    between: dict[int, tuple[dict, set, set]] = {}
    if op_payloads is None or not len(op_call):
        return between
    kernel_calls = set(op_call.tolist())
    for c in range(int(op_call.min()), min(int(op_call.max()), len(op_payloads) - 1) + 1):
        if c not in kernel_calls:
            name = re.match(r'^\{"op":"([^"]*)"', op_payloads[c] or "")
            between[c] = _parse(op_payloads[c], name.group(1) if name else "")
    return between


def _alias_writes(between: dict[int, tuple[dict, set, set]], payloads: list[str] | None) -> set[tuple[int, str]]:
    """(op_call, "w") of the kernel-less op calls that only alias a storage they read: an out-of-place
    op (PyTorch names in-place ops with a trailing underscore) whose output is an input's storage
    (detach, view, t) writes nothing."""
    out = set()
    for c, (_, reads, writes) in between.items():
        name = re.match(r'^\{"op":"([^"]*)"', payloads[c] or "") if payloads else None
        if name and not name.group(1).endswith("_") and writes and writes <= reads:
            out.add((c, "w"))
    return out


def _accesses(nodes: dict[int, tuple[dict, set, set]]) -> dict[str, list[tuple[int, str]]]:
    """storage -> [(op_call, "r" | "w")] in host order (within one call, reads before writes): tells a
    group's real inputs and outputs from addresses the caching allocator reused for other tensors."""
    accesses: dict[str, list[tuple[int, str]]] = {}
    for c, (_, reads, writes) in nodes.items():
        for s in reads:
            accesses.setdefault(s, []).append((c, "r"))
        for s in writes:
            accesses.setdefault(s, []).append((c, "w"))
    for a in accesses.values():
        a.sort(key=lambda x: (x[0], x[1] == "w"))
    return accesses


def _versions(accesses: list[tuple[int, str]]):
    """(writer op_call or None, [reader op_calls]) for each version of one storage (a write starts one)."""
    writer, readers = None, []
    for c, kind in accesses:
        if kind == "w":
            if writer is not None or readers:
                yield writer, readers
            writer, readers = c, []
        elif c != writer:
            readers.append(c)
    yield writer, readers


def _data_edges(accesses: dict[str, list[tuple[int, str]]], eligible: set[int]) -> list[tuple[int, int]]:
    """Producer -> consumer edges between eligible op calls (and kernel-less ones), through a storage
    version whose readers are all eligible: an intermediate a GEMM also reads must be written to
    memory anyway, so it does not join the ops around it (it is a group's output instead)."""
    edges = []
    for acc in accesses.values():
        for writer, readers in _versions(acc):
            if writer in eligible and readers and all(r in eligible for r in readers):
                edges += [(writer, r) for r in readers]
    return edges


def _components(nodes: list[int], edges: list[tuple[int, int]]) -> list[list[int]]:
    """Connected components (union-find), each sorted by host order."""
    parent = {n: n for n in nodes}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in edges:
        parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for n in nodes:
        groups.setdefault(find(n), []).append(n)
    return [sorted(g) for g in groups.values()]


def _convex_parts(group: list[int], rw: dict[int, tuple[set, set]]) -> list[list[int]]:
    """Splits a group where a member depends on an earlier member through an op call outside the group
    (SwiGLU's silu and mul stay one group across up_proj's GEMM, which does not read silu's output;
    a block's first residual add and its last do not, because the MLP's GEMMs sit between them on
    the data path). One fused kernel cannot contain both ends of such a path."""
    members = set(group)
    parts, current = [], []
    tainted: set = set()  # storages derived from the current part through outside op calls
    produced: set = set()  # storages the current part wrote
    for c in range(group[0], group[-1] + 1):
        if c not in rw:
            continue
        reads, writes = rw[c]
        if c in members:
            if reads & tainted:
                parts.append(current)
                current, tainted, produced = [], set(), set()
            current.append(c)
            produced |= writes
        elif reads & (produced | tainted):
            tainted |= writes
    parts.append(current)
    return [p for p in parts if p]


def _chains(calls: pd.DataFrame, parsed: list, between: dict) -> list[tuple[list[int], list[int]]]:
    """(row indices of the kernel-launching calls, kernel-less op_calls) of each candidate group: the
    eligible op calls connected by data edges, on one stream and in one scope (a module's forward
    with its children, or the backward pass), split where the group would not be convex; two or more
    kernel-launching calls."""
    op_call = calls["op_call"].to_numpy()
    row_of = {int(c): i for i, c in enumerate(op_call)}
    scope = np.where(calls["phase"] == "forward", "fwd:" + calls["module"].astype(str), calls["phase"].astype(str))
    rw = {int(c): (p[1], p[2]) for c, p in zip(op_call, parsed)} | {c: (b[1], b[2]) for c, b in between.items()}
    eligible = {int(c) for c, e in zip(op_call, calls["eligible"]) if e} | set(between)
    edges = _data_edges(_accesses({int(c): p for c, p in zip(op_call, parsed)} | between), eligible)

    # a kernel-less op call (a view, a pad's memcpy) takes the place of the kernel-launching call before it
    kernel_calls = np.sort(op_call)
    place = {**row_of, **{c: row_of[int(kernel_calls[max(np.searchsorted(kernel_calls, c) - 1, 0)])] for c in between}}
    stream = calls["stream"].to_numpy()  # read per edge: an array, not a frame lookup

    def same_place(a: int, b: int) -> bool:
        i, j = place[a], place[b]
        x, y = scope[i], scope[j]
        # a module and its children count as one scope (a block's residual add, then its child ln_2)
        related = x == y or (x.startswith("fwd:") and y.startswith("fwd:") and (x.startswith(y + ".") or y.startswith(x + ".")))
        return related and stream[i] == stream[j]

    out = []
    for group in _components(sorted(eligible), [e for e in edges if same_place(*e)]):
        for part in _convex_parts(group, rw):
            kernels = [row_of[c] for c in part if c in row_of]
            if len(kernels) >= 2:
                out.append((kernels, [c for c in part if c in between]))
    return out


def _saved_for_backward(chain: list[int], calls: dict[str, np.ndarray], parsed: list, sizes: dict,
                        accesses: dict, backward: set[int], aliases: set[tuple[int, str]]) -> list[dict]:
    """Forward intermediates of a group that the backward pass reads: a fused kernel must still
    write them (or the backward recomputes them). One dict per storage version written by the group
    and read by a backward op call (``backward``: their op_call numbers) before it is overwritten:
    the op that wrote it, and its bytes. ``aliases`` (:func:`_alias_writes`): accesses that are not
    writes of new data. ``calls``: the op calls' op_call, op and phase columns as arrays (read per
    group: frame lookups took 0.4 s of a 1 M-kernel report)."""
    if (calls["phase"][chain] != "forward").any():
        return []
    writers = {int(calls["op_call"][i]): calls["op"][i] for i in chain}
    found = []
    for s in set().union(*(parsed[i][2] for i in chain)):
        # an alias of the storage (autograd's detach of a saved tensor, a view) is not a new version:
        # the backward reads what the forward wrote (tanh's output in GPT-2's GELU)
        for writer, readers in _versions([a for a in accesses.get(s, []) if a not in aliases]):
            if writer in writers and any(r in backward for r in readers):
                found.append((writer, s))
    # In the order the ops wrote them: a set's order changes with the hash seed, and the same
    # export must give the same report.json in every run.
    return [{"op": writers[w], "bytes": sizes.get(s, 0.0)} for w, s in sorted(found)]


def fusion_candidates(detail: pd.DataFrame, peaks: DevicePeaks, top: int | None = 10,
                      op_payloads: list[str] | None = None) -> list[dict]:
    """Candidates from the detail step's kernels (columns: op_call, op, op_args, module, phase,
    stream_id, start_ns, duration_ns, kernel_class, family), best first, as plain dicts (the
    ``top`` first; all with None). Empty for captures made before gpudiag recorded storage addresses.

    Groups come from the data-flow graph of the step's op calls (storage addresses recorded with
    the op shapes), not from their order in time: SwiGLU's silu and mul are one candidate although
    up_proj's GEMM runs between them. ``saved_for_backward`` lists a forward group's intermediates
    that the backward reads, which a fused kernel would still have to write.

    ``op_payloads`` (JSON payload of every op range, indexed by op_call) adds the op calls that
    launched no kernel to the data flow: a view keeps its storage, but ``F.pad`` with zero padding
    or a same-dtype ``copy_`` makes a new storage by a device-to-device memcpy, and without them a
    group (Swin's LayerNorm -> roll -> pad -> window partition) would look broken."""
    d = detail[detail["op_call"] >= 0]
    if d.empty or not d["op_args"].str.contains("@", regex=False).any():
        return []
    calls = _op_calls(d)
    parsed = [_parse(a, o) for a, o in zip(calls["args"], calls["op"])]  # once per op call of one step
    op_call = calls["op_call"].to_numpy()
    between = _between_calls(op_call, op_payloads)
    sizes: dict[str, float] = {}
    for s, _, _ in parsed:
        sizes.update(s)
    for s, _, _ in between.values():  # a kernel-less view (expand, slice) must not resize a storage
        for k, v in s.items():
            sizes.setdefault(k, v)
    accesses = _accesses({int(c): p for c, p in zip(op_call, parsed)} | between)

    backward = set(calls.loc[calls["phase"] == "backward", "op_call"].astype(int))  # once per step
    aliases = _alias_writes(between, op_payloads)
    groups: dict[tuple, dict] = {}
    # read per chain: arrays, not .loc/.at lookups (kernels and ns are integers: the same sums)
    kernels, ns, op = calls["kernels"].to_numpy(), calls["ns"].to_numpy(), calls["op"].to_numpy()
    columns = {c: calls[c].to_numpy() for c in ("op_call", "op", "phase", "args", "module")}
    for chain, passed in _chains(calls, parsed, between):
        members = {int(op_call[i]) for i in chain} | set(passed)
        touched_here = set().union(*(parsed[i][1] | parsed[i][2] for i in chain),
                                   *(between[c][1] | between[c][2] for c in passed))
        inputs, outputs = set(), set()
        for s in touched_here:
            ours = [a for a in accesses[s] if a[0] in members]
            if ours and ours[0][1] == "r":
                inputs.add(s)  # read before the group wrote it: comes from outside
            written = [c for c, k in ours if k == "w"]
            later = [a for a in accesses[s] if written and a[0] > max(written) and a[0] not in members]
            if written and (later[:1] and later[0][1] == "r" or s in parsed[chain[-1]][2]):
                outputs.add(s)  # read by an op outside the group before being overwritten (or the result)
        external = sum(sizes.get(s, 0.0) for s in inputs | outputs)
        floor = external / peaks.bandwidth * 1e9 + peaks.launch_overhead_ns if peaks.bandwidth else float("nan")
        ops = [op[i] for i in chain]
        key = (tuple(ops), re.sub(r"@[0-9a-f]+", "", columns["args"][chain[0]]))  # same ops on the same shapes
        # the shapes to verify at: the inputs of the group's op call that reads the most bytes (DropPath's
        # chain starts with a bernoulli_ on [B,1,1,1]; the activation comes in with its mul)
        widest = max(chain, key=lambda i: sum(sizes.get(t, 0.0) for t in parsed[i][1]))
        g = groups.setdefault(key, {"ops": ops, "count": 0, "modules": set(), "ns": [], "floor": floor,
                                    "bytes": external, "kernels": int(kernels[chain].sum()),
                                    "shapes": json.loads(columns["args"][widest]).get("in", [])[:3],
                                    "saved": _saved_for_backward(chain, columns, parsed, sizes, accesses, backward, aliases)})
        g["count"] += 1
        g["modules"].add(columns["module"][chain[0]] or columns["phase"][chain[0]])
        g["ns"].append(float(ns[chain].sum()))
    return sorted((_candidate(g) for g in groups.values()), key=lambda c: -c["saving_ns_per_step"])[:top]


def _candidate(g: dict) -> dict:
    """A group of identical occurrences as the report's candidate dict."""
    chain_ns = float(np.median(g["ns"]))
    sequence = " ".join(g["ops"])
    reference = _match(REFERENCE_PATTERNS, sequence)
    return asdict(Candidate(
        ops=g["ops"], occurrences_per_step=g["count"], modules=sorted(g["modules"])[:8], chain_ns=chain_ns,
        fused_floor_ns=g["floor"], saving_ns_per_step=max(chain_ns - g["floor"], 0.0) * g["count"],
        external_bytes=g["bytes"], kernels_per_occurrence=g["kernels"],
        compile_fusable=all(INDUCTOR_FUSABLE.match(o) for o in g["ops"]), reference_kernel=reference,
        example_shapes=[_strip_addresses(s) for s in g["shapes"]], saved_for_backward=g["saved"],
        compile_pattern=None if reference else _match(COMPILE_PATTERNS, sequence)))


def _match(patterns: tuple[tuple[str, str], ...], sequence: str) -> str | None:
    """The name of the first pattern found in a space-separated op sequence; whole op names only
    ("aten::gelu" must not match "aten::gelu_backward")."""
    return next((name for name, pattern in patterns if re.search(rf"(?:^| ){pattern}(?= |$)", sequence)), None)


def saving_by_kernel(candidates: list[dict]) -> list[dict]:
    """Per reference kernel, over all candidates it matches: predicted saving (ns of GPU time per
    step), chains per step, and candidate count; largest first. What applying that kernel
    everywhere it fits would save, by the same fused-floor model as each candidate."""
    rows: dict[str, dict] = {}
    for c in candidates:
        if c["reference_kernel"]:
            row = rows.setdefault(c["reference_kernel"], {"reference_kernel": c["reference_kernel"],
                                                          "saving_ns_per_step": 0.0, "chains_per_step": 0, "candidates": 0})
            row["saving_ns_per_step"] += c["saving_ns_per_step"]
            row["chains_per_step"] += c["occurrences_per_step"]
            row["candidates"] += 1
    return sorted(rows.values(), key=lambda r: -r["saving_ns_per_step"])


# Measured on an H200 (docs/notes/measurements.md, 2026-11-21): Swin-T bf16 training at batch 32,
# overhead-bound (GD-OVERHEAD-BOUND fired), ran 15-23 % slower with the reference kernels and 45 %
# faster with torch.compile; at batch 128 (GPU-bound) the same kernels saved 26 % of the step.
# A reference kernel launched from Python costs 22-81 us of host time per forward call against
# 12-66 us for the eager chain it replaces, more for all but RMSNorm, and 230-690 us per forward +
# backward (benchmarks/host_launch_cost.py).
HOST_BOUND_ADVICE = ("the step is overhead-bound: the host, not the GPU, sets its time, and a Triton kernel launched "
                     "from Python usually costs more host time than the eager ops it replaces, so this GPU-time saving "
                     "is unlikely to shorten the step; use torch.compile (mode=\"reduce-overhead\" adds CUDA Graphs) or a "
                     "larger batch first, then fuse")


def mark_host_bound(candidates: list[dict], recommendations: list[dict]) -> str | None:
    """Sets ``host_bound`` on every candidate: whether the overhead-bound rule fired, so that its
    saving is GPU time the step is unlikely to get back. Returns the note the report shows once
    above the candidates (:data:`HOST_BOUND_ADVICE`, whose comment gives the measurements), or None
    (threshold: the GD-OVERHEAD-BOUND rule's)."""
    host_bound = any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in recommendations)
    for c in candidates:
        c["host_bound"] = host_bound
    return HOST_BOUND_ADVICE if host_bound else None
