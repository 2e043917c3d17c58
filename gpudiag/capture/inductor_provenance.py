"""Where Inductor's generated kernels come from, recorded in the profiled process.

Inside ``torch.compile``d code gpudiag's module hooks are traced away (no graph break), so the
GPU kernels of a compiled graph only see the module range around the compiled call. This module
records, while Inductor generates code, what PyTorch itself knows about every generated kernel, and
marks every run of a compiled graph with an NVTX range, so the analysis
(:mod:`gpudiag.analysis.attribution.compiled`) can put each kernel back under the module it came from.

How (the same in torch 2.11 and 2.13):

- **Kernel provenance.** Inductor calls ``torch._inductor.debug.set_kernel_post_grad_provenance_tracing
  (node_schedule, kernel_name, is_extern)`` at every kernel call site it emits (Triton, C++, templates,
  extern calls such as ``extern_kernels.mm``), in the wrapper's call order, whatever
  ``config.trace.provenance_tracking_level`` is (at level 0 it returns at once). gpudiag wraps it: the
  call site's post-grad FX nodes (``origins``) carry ``nn_module_stack`` (forward, and forward ops
  recomputed in backward), ``fwd_nn_module_stack`` (backward nodes, copied by AOTAutograd),
  ``stack_trace`` and ``original_aten``. Provenance tracking itself stays off: turning it on would
  change the FX graph cache key (``FxGraphHashDetails.provenance_tracking_level``), the node metadata
  kept while tracing and the generated code's comments.
- **Graph runs.** ``CompiledFxGraph.__init__`` (which receives the GraphLowering whose codegen was
  just recorded) gets a graph id; ``CompiledFxGraph.__call__`` pushes ``gpudiag:graph <id>`` around
  each run (one push/pop per call, outside Dynamo tracing, so no graph break or guard); a graph with
  symbolic sizes adds the values of the symbols its call sites' costs use, read from the run's inputs
  (``gpudiag:graph 3 s33=8``: :func:`symbol_sources`, :func:`run_symbols`). With CUDA
  graphs (``mode="reduce-overhead"``) the call wraps the cudagraph-tree replay, whose graph launch is
  then inside the range.
- **Caches.** A graph loaded from the FX graph cache or the AOTAutograd cache is never generated, so
  nothing would be recorded: by default the launcher's process compiles afresh
  (``torch._inductor.config.fx_graph_cache`` and ``torch._functorch.config.enable_autograd_cache``
  off; the Triton/C++ binaries are still reused). Results and guards are unchanged.

Patches are applied when Inductor's modules are first imported (an import hook), so a script that
never compiles pays nothing. Nothing here raises into the user's script: failures become warnings
in :func:`collect`'s result.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import threading
import weakref

from gpudiag import nvtx_names
from gpudiag.capture import import_hook

_DEBUG_MODULE = "torch._inductor.debug"
_OUTPUT_CODE_MODULE = "torch._inductor.output_code"
_TRACING_FN = "set_kernel_post_grad_provenance_tracing"
_GRAPH_ATTR = "_gpudiag_graph_text"  # set on each CompiledFxGraph instance: its NVTX range text
_MAX_OPS = 12
_MAX_WARNINGS = 20


class _State:
    def __init__(self, nvtx, fresh_compile: bool) -> None:
        self.nvtx = nvtx
        self.fresh_compile = fresh_compile
        self.lock = threading.Lock()
        self.pending: dict[int, list[dict]] = {}  # id(GraphLowering) -> kernel call sites, in order
        self.graphs: dict[int, dict] = {}  # graph id -> compile id, kind, kernels
        self.calls: collections.Counter = collections.Counter()  # graph id -> runs
        self.warnings: list[str] = []
        self.patched: list[str] = []
        self.token = object()  # identifies this process's graph ids (see _new_graph)

    def warn(self, text: str) -> None:
        if len(self.warnings) < _MAX_WARNINGS and text not in self.warnings:
            self.warnings.append(text)


_state: _State | None = None


# ---- FX node metadata -> module path, source line, ops -------------------------------------------

_ROOT = re.compile(r"""^(?:[LG]\[(['"])(?P<q>.+?)\1\]|(?P<bare>[A-Za-z_]\w*))""")


def module_path(dynamo_path: str) -> tuple[str, str]:
    """Split a Dynamo ``nn_module_stack`` path into (root, path relative to the root).

    ``"L['self'].blocks[0].fc1"`` -> ``("self", "blocks.0.fc1")``; ``"G['model']"`` -> ``("model", "")``.
    The root is the compiled frame's local (or global) the modules hang from; ``self`` when the
    compiled callable is a module's forward."""
    text = re.sub(r"\._(?:modules|parameters|buffers)\[(['\"])([^'\"\]]+)\1\]", r".\2", str(dynamo_path))
    m = _ROOT.match(text)
    if m is None:
        return "", text.strip(".")
    rest = text[m.end():]
    rest = re.sub(r"""\[(['"])(.*?)\1\]""", r".\2", rest)  # ['name'] -> .name
    rest = re.sub(r"\[(\d+)\]", r".\1", rest)  # [0] -> .0
    return m.group("q") or m.group("bare"), rest.strip(".")


def _node_module(meta: dict) -> tuple[str, str, str] | None:
    """(root, relative path, class name) of the innermost module of an FX node; None when the node
    carries no module stack. An empty stack is the compiled frame's own code: path ``""``."""
    stack = meta.get("nn_module_stack")
    if stack is None:
        stack = meta.get("fwd_nn_module_stack")  # backward nodes: their forward node's stack
    if stack is None:
        return None
    if not stack:
        return ("", "", "")
    path, cls = list(stack.values())[-1]
    root, rel = module_path(path)
    return root, rel, getattr(cls, "__name__", str(cls))


_TORCH_DIR = None


def _user_frame(stack_trace: str | None) -> str | None:
    """``file:line`` of the innermost frame of ``stack_trace`` outside torch's own package."""
    global _TORCH_DIR
    if not stack_trace:
        return None
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)] or frames
    return f"{user[-1][0]}:{user[-1][1]}" if user else None


def _origin_nodes(node_schedule, is_extern: bool) -> list:
    """Post-grad FX nodes that produced a kernel call site."""
    if is_extern:
        node = getattr(node_schedule, "origin_node", None)  # exactly this node's output, when known
        return [node] if node is not None else list(getattr(node_schedule, "origins", None) or ())
    nodes = []
    for snode in node_schedule:
        parts = snode.get_nodes() if hasattr(snode, "get_nodes") else [snode]
        for part in parts:
            ir_node = getattr(part, "node", None)  # Enable/DisableReduction markers have none
            if ir_node is not None:
                nodes.extend(getattr(ir_node, "origins", None) or ())
    return nodes


def _described(value):
    """JSON-able form of one FX argument, as the op ranges describe aten arguments (``"bfloat16[8,16]"``
    for a tensor; numbers, booleans and None as they are); a symbolic size as its expression
    (``"bfloat16[s33,16]"``: ``str`` of a SymInt reads its expression and adds no guard, where ``int``
    would specialize the graph), bound per graph run by the analysis. Not
    :func:`gpudiag.capture.op_ranges.describe_value`: a traced value has no storage (its address reads
    0, with a warning in the user's process)."""
    import torch.fx

    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, (list, tuple)):
        return [_described(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return f"{str(dtype).removeprefix('torch.')}[{','.join(str(s).replace(' ', '') for s in shape)}]"


def _free_symbols(values) -> set[str]:
    """Names of the size symbols (``s33``) in traced values' shapes."""
    out: set[str] = set()
    for value in values:
        for size in getattr(value, "shape", None) or ():
            expr = getattr(getattr(size, "node", None), "expr", None)
            out.update(str(sym) for sym in getattr(expr, "free_symbols", ()))
    return out


def contraction_payload(nodes) -> dict | None:
    """The op range payload (``{"op", "in", "out"}``, as :mod:`gpudiag.capture.op_ranges` writes it)
    of the one contraction (matmul, convolution, attention: the cost model's
    ``CONTRACTION_OPS`` and SDPA ops) among a call site's FX nodes, with the shapes Inductor traced
    (``meta["val"]``); None when the site has none or several. A symbolic shape keeps its expression
    and the payload lists its symbols (``"symbols": ["s33"]``): each graph run records their values
    (:func:`symbol_sources`). A template kernel's epilogue (a bias, a residual add) is not in it: the
    contraction's FLOPs are its FLOPs."""
    import torch.fx

    from gpudiag.analysis.roofline.costmodel import CONTRACTION_OPS, SDPA_PREFIXES

    found = []
    for node in nodes:
        name = getattr(getattr(getattr(node, "target", None), "_schema", None), "name", None)
        if name and (name in CONTRACTION_OPS or name.startswith(SDPA_PREFIXES)) and node not in found:
            found.append(node)
    if len(found) != 1:
        return None
    node = found[0]
    ins = [_described(a) for a in node.args]
    if node.kwargs:
        ins.append({k: _described(v) for k, v in node.kwargs.items()})
    out = _described(node.meta.get("val"))
    if out is None or any(d is None for d, a in zip(ins, node.args) if isinstance(a, torch.fx.Node)):
        return None
    payload = {"op": node.target._schema.name, "in": ins, "out": out}
    traced = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)] + [node.meta.get("val")]
    if symbols := _free_symbols(traced):
        payload["symbols"] = sorted(symbols)
    return payload


def symbol_sources(graph, kernels: list[dict]) -> dict[str, tuple[int, int | None]]:
    """Where each size symbol the call sites' costs use is read from a graph run's inputs:
    ``{"s33": (input index, None)}`` for a symbol passed as an input (Inductor passes the sizes it
    needs), ``(input index, dim)`` for one that is a tensor input's size; inputs in
    ``graph.graph_input_names`` order, as ``CompiledFxGraph.__call__`` receives them (torch 2.11,
    2.13). A symbol found in neither is left out (its costs get no shapes)."""
    import sympy

    wanted = {s for k in kernels for s in ((k.get("cost") or {}).get("symbols") or ())}
    sources: dict[str, tuple[int, int | None]] = {}
    if not wanted:
        return sources
    for i, name in enumerate(getattr(graph, "graph_input_names", None) or ()):
        value = graph.graph_inputs.get(name)
        if isinstance(value, sympy.Symbol) and str(value) in wanted:
            sources.setdefault(str(value), (i, None))
            continue
        sizes = value.get_size() if hasattr(value, "get_size") else ()
        for d, size in enumerate(sizes):
            if isinstance(size, sympy.Symbol) and str(size) in wanted:
                sources.setdefault(str(size), (i, d))
    return sources


def run_symbols(sources: dict[str, tuple[int, int | None]], inputs) -> str:
    """`` s33=8 s34=512``: the values of a graph run's size symbols, read from its inputs (ints, and
    tensor sizes: no device sync); '' without symbols."""
    parts = []
    for name, (i, d) in sources.items():
        value = inputs[i] if d is None else inputs[i].shape[d]
        parts.append(f" {name}={int(value)}")
    return "".join(parts)


def kernel_record(kernel_name: str, nodes, is_extern: bool) -> dict:
    """What one kernel call site came from: ``module`` (path relative to the compiled frame's root,
    the module with most origin nodes; None when no node has a module stack), ``module_class``,
    ``root`` (the frame's local the path starts from), ``modules`` (path -> origin node count; in a
    backward graph the module is chosen among backward nodes, not recomputed forward ones),
    ``source`` (``file:line`` of the innermost user frame, the most common among the module's nodes),
    ``ops`` (the aten ops the nodes were decomposed from), ``cost`` (:func:`contraction_payload`: the
    matmul, convolution or attention an extern call or a GEMM template computes, with its shapes, or
    None)."""
    counts: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()  # backward nodes only (see below)
    classes, roots, lines, ops = {}, {}, collections.defaultdict(collections.Counter), []
    for node in nodes:
        meta = getattr(node, "meta", None) or {}
        found = _node_module(meta)
        key = found[1] if found else None
        if found:
            counts[key] += 1
            # In a backward graph, forward ops recomputed for it keep their forward module stack;
            # the kernel's own work is the backward nodes (those with fwd_nn_module_stack).
            own[key] += "fwd_nn_module_stack" in meta and "nn_module_stack" not in meta
            roots.setdefault(key, found[0])
            if found[2]:
                classes.setdefault(key, found[2])
        line = _user_frame(meta.get("stack_trace"))
        if line:
            lines[key][line] += 1
        op = meta.get("original_aten")
        if op is not None and str(op) not in ops and len(ops) < _MAX_OPS:
            ops.append(str(op))
    own = +own  # drops zero counts
    module = (own or counts).most_common(1)[0][0] if counts else None
    source_counts = lines.get(module) or sum(lines.values(), collections.Counter())
    return {"name": kernel_name, "kind": _kind(kernel_name, is_extern), "module": module,
            "module_class": classes.get(module), "root": roots.get(module), "modules": dict(counts),
            "source": source_counts.most_common(1)[0][0] if source_counts else None, "ops": ops,
            # a Triton kernel fused around a convolution or a matmul (its input cast, its epilogue)
            # lists the contraction among its origins but does not compute it
            "cost": contraction_payload(nodes) if _kind(kernel_name, is_extern) in ("extern", "template") else None}


def _kind(name: str, is_extern: bool) -> str:
    if is_extern:
        return "extern"
    for prefix, kind in (("triton_tem", "template"), ("triton", "triton"), ("cpp", "cpp")):
        if name.startswith(prefix):
            return kind
    return "other"


# ---- patches ---------------------------------------------------------------------------------

def _root_graph(graph):
    """The top GraphLowering: a subgraph's kernels (cond, while_loop, invoke_subgraph bodies) are
    emitted into its parent's wrapper, in the parent's call order."""
    for _ in range(32):
        parent = getattr(graph, "parent", None)
        if parent is None:
            break
        graph = parent
    return graph


def _record_call_site(state: _State, node_schedule, kernel_name, is_extern: bool) -> None:
    from torch._inductor.virtualized import V

    graph = _root_graph(V.graph)
    record = kernel_record(str(kernel_name), _origin_nodes(node_schedule, is_extern), is_extern)
    with state.lock:
        entry = state.pending.get(id(graph))
        if entry is None or entry[0]() is not graph:  # a stale entry of a collected graph with this id
            entry = state.pending[id(graph)] = (weakref.ref(graph), [])
        entry[1].append(record)


def _wrap_tracing_fn(original):
    def set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name, is_extern=False, *args, **kwargs):
        state = _state
        if state is not None and kernel_name:
            try:
                _record_call_site(state, node_schedule, kernel_name, bool(is_extern))
            except Exception as exc:  # noqa: BLE001 - a profiler must not break compilation
                state.warn(f"provenance of kernel {kernel_name}: {type(exc).__name__}: {exc}")
        return original(node_schedule, kernel_name, is_extern, *args, **kwargs)

    set_kernel_post_grad_provenance_tracing.__wrapped__ = original
    set_kernel_post_grad_provenance_tracing._gpudiag = True
    return set_kernel_post_grad_provenance_tracing


def _patch_debug(module) -> None:
    """Wrap the tracing function in ``torch._inductor.debug`` and in every Inductor module that
    already imported it by name (``codegen/triton.py``, ``codegen/cpp.py`` do); later importers
    get the wrapper from ``debug``."""
    original = getattr(module, _TRACING_FN)
    if getattr(original, "_gpudiag", False):
        return
    wrapper = _wrap_tracing_fn(original)
    for name, mod in list(sys.modules.items()):
        if name.startswith("torch._inductor") and getattr(mod, _TRACING_FN, None) is original:
            setattr(mod, _TRACING_FN, wrapper)
    _state.patched.append(_DEBUG_MODULE + "." + _TRACING_FN)


def _graph_kind(graph) -> str:
    if getattr(graph, "is_backward", False):
        return "backward"
    return "inference" if getattr(graph, "is_inference", False) else "forward"


def _new_graph(state: _State, compiled, graph) -> None:
    """Give a CompiledFxGraph its id and NVTX text; attach the call sites recorded for ``graph``
    (None for a graph that was not generated in this process, e.g. loaded from a cache)."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    with state.lock:
        gid = len(state.graphs)
        entry = state.pending.pop(id(graph), None) if graph is not None else None
        kernels = entry[1] if entry is not None and entry[0]() is graph else []
        state.graphs[gid] = {"compile_id": str(compile_id) if compile_id is not None else None,
                             "kind": _graph_kind(graph) if graph is not None else None,
                             "generated": graph is not None, "kernels": kernels}
    sources = symbol_sources(graph, kernels) if graph is not None else {}
    # The token ties the id to this process: a graph pickled into a cache by an earlier profiled
    # run carries the attribute too, and its id means nothing here.
    compiled.__dict__[_GRAPH_ATTR] = (state.token, gid, nvtx_names.GRAPH + str(gid), sources)


def _wrap_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = _state
        if state is not None:
            try:
                _new_graph(state, self, args[1] if len(args) > 1 else kwargs.get("graph"))
            except Exception as exc:  # noqa: BLE001
                state.warn(f"compiled graph registration: {type(exc).__name__}: {exc}")

    __init__.__wrapped__ = original
    return __init__


def _graph_of(state: _State, compiled):
    tag = compiled.__dict__.get(_GRAPH_ATTR)
    if tag is None or tag[0] is not state.token:
        _new_graph(state, compiled, None)
        tag = compiled.__dict__[_GRAPH_ATTR]
    return tag


def _wrap_call(original):
    def __call__(self, *args, **kwargs):
        state = _state
        pushed = False
        if state is not None:
            try:
                _, gid, text, sources = _graph_of(state, self)
                state.calls[gid] += 1
                if sources and args:  # a dynamic-shape graph's run says its size symbols' values
                    try:
                        text += run_symbols(sources, args[0])
                    except Exception as exc:  # noqa: BLE001 - the run keeps its range; its costs go
                        state.warn(f"graph sizes: {type(exc).__name__}: {exc}")
                state.nvtx.push(text)
                pushed = True
            except Exception as exc:  # noqa: BLE001
                state.warn(f"graph range: {type(exc).__name__}: {exc}")
        try:
            return original(self, *args, **kwargs)
        finally:
            if pushed:
                try:
                    state.nvtx.pop()
                except Exception as exc:  # noqa: BLE001
                    state.warn(f"graph range pop: {type(exc).__name__}: {exc}")

    __call__.__wrapped__ = original
    return __call__


def _patch_output_code(module) -> None:
    cls = module.CompiledFxGraph
    if getattr(cls, "_gpudiag", False):
        return
    cls.__init__ = _wrap_init(cls.__init__)
    cls.__call__ = _wrap_call(cls.__call__)
    cls._gpudiag = True
    _state.patched.append(_OUTPUT_CODE_MODULE + ".CompiledFxGraph")
    if _state.fresh_compile:
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False


def _guarded(patch):
    def run(module) -> None:
        try:
            patch(module)
        except Exception as exc:  # noqa: BLE001 - this torch differs: no provenance, the script runs
            if _state is not None:
                _state.warn(f"cannot patch {module.__name__} ({type(exc).__name__}: {exc}); "
                            "compiled kernels keep the module around the compiled call")
    return run


# ---- public ----------------------------------------------------------------------------------

def _disown() -> None:
    """In a forked child (a DataLoader worker): record nothing; the parent's status has its own."""
    global _state
    _state = None


def install(nvtx, fresh_compile: bool = True) -> None:
    """Start recording in this process (the launcher calls it before the user's script runs).

    ``nvtx``: an object with ``push(text)`` and ``pop()`` (the launcher's NVTX backend).
    ``fresh_compile``: turn Inductor's FX graph cache and AOTAutograd's cache off, so that every
    graph is generated (and recorded) here. Never raises; a second call does nothing."""
    global _state
    if _state is not None:
        return
    _state = _State(nvtx, fresh_compile)
    from gpudiag.capture import model_modules

    model_modules.register_disown(_disown)
    callbacks = {_DEBUG_MODULE: _guarded(_patch_debug), _OUTPUT_CODE_MODULE: _guarded(_patch_output_code)}
    try:
        for name, callback in callbacks.items():
            import_hook.when_imported(name, callback)
    except Exception as exc:  # noqa: BLE001
        _state.warn(f"inductor provenance not installed: {type(exc).__name__}: {exc}")


def collect() -> dict:
    """What was recorded, JSON-able (the launcher stores it in the status file):

    ``{"fresh_compile": bool, "patched": [...], "warnings": [...], "graphs": {"<id>": {"compile_id":
    "0/0", "kind": "forward"|"backward"|"inference"|None, "generated": bool, "calls": int,
    "kernels": [kernel_record, ...]}}}``, the kernel records in the wrapper's call order (a name
    repeats when Inductor reuses a kernel at several call sites). ``generated`` is False for graphs
    loaded from a cache (no kernels recorded). Empty graphs when nothing was compiled."""
    state = _state
    if state is None:
        return {}
    try:
        with state.lock:
            graphs = {str(gid): {**info, "calls": int(state.calls.get(gid, 0))} for gid, info in state.graphs.items()}
        missing = [gid for gid, info in graphs.items() if not info["generated"]]
        if missing:
            state.warn(f"{len(missing)} compiled graph(s) were not generated in this process (loaded from a cache): "
                       "their kernels keep the module around the compiled call")
        return {"fresh_compile": state.fresh_compile, "patched": list(state.patched),
                "warnings": list(state.warnings), "graphs": graphs}
    except Exception as exc:  # noqa: BLE001
        return {"warnings": [f"inductor provenance: {type(exc).__name__}: {exc}"], "graphs": {}}
