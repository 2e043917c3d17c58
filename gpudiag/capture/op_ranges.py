"""The texts and backends of the NVTX ranges :mod:`gpudiag.capture.instrument` emits: the NVTX
backend (``torch.cuda.nvtx``, or nothing on a CPU-only torch) and the per-aten-op ranges of the
detail step, whose texts describe every tensor by dtype, shape and storage address (which op wrote
what another reads: the data flow :mod:`gpudiag.analysis.fusion.dataflow` builds)."""

from __future__ import annotations

import json
import warnings

from gpudiag import nvtx_names


class TorchNvtx:
    """NVTX through ``torch.cuda.nvtx`` (no extra dependency; works wherever CUDA torch does)."""

    def __init__(self) -> None:
        import torch.cuda.nvtx as nvtx

        # Bind the originals: the nvtx:REGEX step mode wraps the module's functions.
        self.push = nvtx.range_push
        self.pop = nvtx.range_pop
        self.start = nvtx.range_start
        self.end = nvtx.range_end


class NullNvtx:
    """Does nothing: used where torch has no NVTX (a CPU-only build), so the script still runs."""

    def push(self, text: str) -> None:
        pass

    def pop(self) -> None:
        pass

    def start(self, text: str) -> int:
        return 0

    def end(self, range_id: int) -> None:
        pass


def default_nvtx():
    """:class:`TorchNvtx` if this torch can emit NVTX, else :class:`NullNvtx` with a warning."""
    backend = TorchNvtx()
    try:
        backend.push(nvtx_names.PREFIX + "probe")
        backend.pop()
    except RuntimeError as exc:  # CPU-only torch: "NVTX functions not installed"
        warnings.warn(f"gpudiag: no NVTX in this torch ({exc}); the capture will have no gpudiag ranges")
        return NullNvtx()
    return backend


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_value(value):
    """JSON-able description of one aten argument: tensors as ``"bfloat16[32,768]@7f3a2c000000"``
    (dtype, shape, storage address: which op wrote what another reads, for the dependency analysis),
    long tensor lists summarised (optimizer foreach ops pass hundreds), scalars and small lists as
    they are."""
    import torch

    if isinstance(value, torch.Tensor):
        text = f"{_dtype_name(value.dtype)}[{','.join(str(s) for s in value.shape)}]"
        try:
            return f"{text}@{value.untyped_storage().data_ptr():x}"
        except (RuntimeError, NotImplementedError):  # tensors without storage (meta, sparse, subclasses)
            return text
    if isinstance(value, (list, tuple)):
        if len(value) > 8 and all(isinstance(v, torch.Tensor) for v in value):
            return {
                "tensors": len(value),
                "dtype": _dtype_name(value[0].dtype),
                "numel": int(sum(v.numel() for v in value)),
            }
        return [describe_value(v) for v in value[:16]]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return type(value).__name__


def op_range_text(func, args, kwargs) -> str:
    """NVTX text of one aten op call: name and described inputs (positional, then keyword)."""
    inputs = [describe_value(a) for a in args]
    if kwargs:
        inputs.append({k: describe_value(v) for k, v in kwargs.items()})
    # func is an OpOverload such as aten.mm.default; its schema name is "aten::mm".
    name = func._schema.name if hasattr(func, "_schema") else str(func)
    return nvtx_names.OP + json.dumps({"op": name, "in": inputs}, separators=(",", ":"))


def out_range_text(out) -> str:
    """NVTX text of an op's outputs, emitted as an empty range nested at the end of the op's range."""
    return nvtx_names.OUT + json.dumps(describe_value(out), separators=(",", ":"))


def make_op_mode(nvtx):
    """A ``TorchDispatchMode`` that emits one NVTX range per aten op through ``nvtx`` (the backend
    above), entered on the detail step only (:func:`gpudiag.capture.steps_core.start_op_ranges_if_detail`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRanges(TorchDispatchMode):
        """One NVTX range per aten op, enclosing its kernel launches. Outputs are only known after
        the call, so they go into an empty range nested just before the op's range closes."""

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # Without this, Dynamo refuses to run compiled code while a dispatch mode is active
            # and the detail step would run eagerly (other kernels, other numerics). With it, the
            # compiled artifact runs as compiled; the mode sees only the aten calls it makes.
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "profiler":  # record_function markers launch nothing
                return func(*args, **kwargs)
            nvtx.push(op_range_text(func, args, kwargs))
            try:
                out = func(*args, **kwargs)
                nvtx.push(out_range_text(out))
                nvtx.pop()
                return out
            finally:
                nvtx.pop()

    return OpRanges()
