"""First-cut op cost model: FLOPs and minimum DRAM bytes of an aten op from the shapes and dtypes
recorded on the detail step (the ``gpudiag:op`` NVTX payload).

- bytes: every tensor input read once plus every output written once (the minimum traffic,
  Williams et al. 2009, "Roofline", CACM 52(4)).
- FLOPs: contractions use 2 FLOP per multiply-add: mm/addmm 2·M·N·K, bmm/baddbmm 2·B·M·N·K
  (``linear`` and ``matmul`` reach the dispatcher as these), convolution
  2·N·Cout·Hout·Wout·(Cin/groups)·kh·kw (backward: twice the forward, for the input and weight
  gradients; transposed convolutions are not modelled), scaled-dot-product attention 4·B·H·L·S·D
  (backward 2.5x the forward: Dao et al. 2022, "FlashAttention", section 3.1 and appendix B). Any other op is
  counted as one FLOP per element of its largest operand (the
  output of an element-wise op, the input of a reduction).
- math path: contractions in bf16/fp16 run on tensor cores; fp32 matmuls on the fp32 SIMT path
  (PyTorch's default ``allow_tf32=False``), fp32 convolutions on TF32 (cuDNN's default
  ``allow_tf32=True``); other ops on the fp32 path.

The next issue replaces this with a complete model; keep its interface: :func:`op_cost`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

_TENSOR = re.compile(r"^([a-z0-9_]+)\[([0-9,]*)\]$")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
DTYPE_PATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
              "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8"}

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
CONV_OPS = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::convolution_backward"}
SDPA_PREFIX = "aten::_scaled_dot_product"
CONTRACTION_OPS = MATMUL_OPS | CONV_OPS


@dataclass(frozen=True)
class OpCost:
    """FLOPs (``flop``) and minimum DRAM traffic (``bytes``) of one op call, and its math path."""

    flop: float
    bytes: float
    math_path: str  # bf16, fp16, tf32, fp32, fp64, fp8, int8

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP/byte."""
        return self.flop / self.bytes if self.bytes else math.inf


def _tensors(value) -> list[tuple[str, list[int]]]:
    """Tensors described in a (nested) payload value, as (dtype, shape)."""
    found = []
    if isinstance(value, str):
        m = _TENSOR.match(value)
        if m:
            found.append((m.group(1), [int(x) for x in m.group(2).split(",") if x]))
    elif isinstance(value, list):
        for v in value:
            found.extend(_tensors(v))
    elif isinstance(value, dict):
        if "tensors" in value and "numel" in value:  # summarised tensor list (foreach ops)
            found.append((value.get("dtype", "float32"), [int(value["numel"])]))
        else:
            for v in value.values():
                found.extend(_tensors(v))
    return found


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _nbytes(tensors) -> float:
    return float(sum(_numel(s) * ITEMSIZE.get(d, 4) for d, s in tensors))


def op_cost(op: str, args_json: str) -> OpCost | None:
    """Cost of one op from its NVTX payload (``{"op":..,"in":[..],"out":..}``); None if the payload
    cannot be parsed or names no tensor."""
    try:
        payload = json.loads(args_json)
    except ValueError:
        return None
    ins, outs = _tensors(payload.get("in", [])), _tensors(payload.get("out"))
    if not ins and not outs:
        return None
    nbytes = _nbytes(ins) + _nbytes(outs)
    dtype = (ins or outs)[0][0]
    path = DTYPE_PATH.get(dtype, "fp32")
    shapes = [s for _, s in ins]
    flop = None
    if op in ("aten::mm", "aten::matmul") and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        flop = 2.0 * m * n * k
    elif op == "aten::addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1][-2:], shapes[2][-2:]
        flop = 2.0 * m * n * k
    elif op == "aten::bmm" and len(shapes) >= 2 and len(shapes[0]) == 3:
        (b, m, k), n = shapes[0], shapes[1][-1]
        flop = 2.0 * b * m * n * k
    elif op == "aten::baddbmm" and len(shapes) >= 3 and len(shapes[1]) == 3:
        (b, m, k), n = shapes[1], shapes[2][-1]
        flop = 2.0 * b * m * n * k
    elif op in CONV_OPS and outs:
        flop = _conv_flop(op, shapes, [s for _, s in outs])
        if dtype == "float32":
            path = "tf32"
    elif op.startswith(SDPA_PREFIX):
        # forward inputs: query, key, value; backward: grad_out, query, key, value
        q_at = 1 if "backward" in op else 0
        if len(shapes) > q_at + 1 and len(shapes[q_at]) == 4 and len(shapes[q_at + 1]) == 4:
            b, h, l, d = shapes[q_at]
            s = shapes[q_at + 1][2]
            flop = 4.0 * b * h * l * s * d * (2.5 if "backward" in op else 1.0)
    contraction = flop is not None
    if not contraction:
        # one FLOP per element of the largest operand: outputs for element-wise ops, inputs for reductions
        flop = float(max(_numel(s) for _, s in ins + outs))
        path = "fp64" if path == "fp64" else "fp32"  # not a contraction: no tensor cores
    return OpCost(flop=flop, bytes=nbytes, math_path=path)


def _conv_flop(op: str, shapes: list[list[int]], out_shapes: list[list[int]]) -> float | None:
    if op == "aten::convolution_backward":
        # inputs: grad_output, input, weight
        if len(shapes) < 3 or len(shapes[2]) < 3:
            return None
        grad_out, weight = shapes[0], shapes[2]
        per_out = _numel(weight[1:])  # Cin/groups * kh * kw
        return 2.0 * 2.0 * _numel(grad_out) * per_out
    if len(shapes) < 2 or len(shapes[1]) < 3:
        return None
    weight, out = shapes[1], out_shapes[0]
    return 2.0 * _numel(out) * _numel(weight[1:])
