"""First-cut op cost model: FLOPs and minimum DRAM bytes of an aten op from the shapes and dtypes
recorded on the detail step (the ``gpudiag:op`` NVTX payload).

- bytes: every tensor input read once plus every output written once (the minimum traffic,
  Williams et al. 2009, "Roofline", CACM 52(4)).
- FLOPs: contractions use 2 FLOP per multiply-add: mm/addmm/linear/matmul 2·M·N·K (times the
  broadcast batch), bmm/baddbmm 2·B·M·N·K (with autograd on, linear and matmul reach the dispatcher
  as these; under ``inference_mode`` as themselves), convolution
  2·N·Cout·Hout·Wout·(Cin/groups)·kh·kw (backward: twice the forward, for the input and weight
  gradients; transposed convolutions are not modelled), grouped GEMMs (``_grouped_mm``: a mixture
  of experts) 2·M·N·K summed over the groups (:func:`_grouped_mm_flop`), scaled-dot-product attention 4·B·H·L·S·D
  (backward 2.5x the forward: Dao et al. 2022, "FlashAttention", section 3.1 and appendix B).
- per-element FLOPs of the other ops that compute (:data:`FLOP_PER_ELEMENT`, of the largest
  operand): LayerNorm / GroupNorm / BatchNorm 5 and RMSNorm 4 with affine parameters (the DeepSpeed
  flops profiler's counts: mean, variance, normalize, scale, shift), softmax and log-softmax 5 (max,
  subtract, exp, sum, divide or log), cross-entropy/NLL 1, Adam/AdamW 15 per parameter (moment
  updates 7, bias corrections and the update 8); backward passes twice their forward (the usual
  backward ≈ 2x forward rule, Kaplan et al. 2020, "Scaling Laws for Neural Language Models", 2.1).
- data-movement ops (copies, casts, cat, index/gather/scatter, roll, permute+contiguous, padding,
  embedding lookups; :data:`DATA_MOVEMENT_OPS`) do no arithmetic: 0 FLOP, all bytes. Any other op is
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

_TENSOR = re.compile(r"^([a-z0-9_]+)\[([0-9,]*)\](?:@([0-9a-f]+))?$")  # dtype[shape]@storage address
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
DTYPE_PATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
              "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8"}

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
CONV_OPS = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::convolution_backward",
            "aten::conv1d", "aten::conv2d", "aten::conv3d"}
SDPA_PREFIXES = ("aten::_scaled_dot_product", "aten::scaled_dot_product_attention", "aten::_flash_attention",
                 "aten::_efficient_attention")

DATA_MOVEMENT_OPS = {
    "aten::_to_copy", "aten::copy_", "aten::clone", "aten::cat", "aten::stack", "aten::index", "aten::index_select",
    "aten::index_put_", "aten::gather", "aten::scatter", "aten::scatter_", "aten::roll", "aten::permute",
    "aten::transpose", "aten::contiguous", "aten::constant_pad_nd", "aten::embedding", "aten::fill_", "aten::zero_",
    "aten::zeros_like", "aten::ones_like", "aten::new_zeros", "aten::slice_scatter", "aten::select_scatter",
    "aten::repeat", "aten::expand", "aten::flip", "aten::masked_fill", "aten::masked_fill_", "aten::where",
}
# FLOPs per element of the largest operand, forward; "_backward" ops count twice (module docstring).
FLOP_PER_ELEMENT = {
    "aten::native_layer_norm": 5.0, "aten::layer_norm": 5.0, "aten::native_group_norm": 5.0,
    "aten::native_batch_norm": 5.0, "aten::_native_batch_norm_legit": 5.0, "aten::_fused_rms_norm": 4.0,
    "aten::rms_norm": 4.0, "aten::_softmax": 5.0, "aten::softmax": 5.0, "aten::_log_softmax": 5.0,
    "aten::log_softmax": 5.0, "aten::nll_loss_forward": 1.0, "aten::nll_loss": 1.0, "aten::cross_entropy_loss": 6.0,
    "aten::_fused_adamw_": 15.0, "aten::_fused_adam_": 15.0,
}
# Grouped GEMMs (a mixture of experts' expert layers: torch._grouped_mm, F.grouped_mm): one op, one
# GEMM per group, the groups' rows or K given by the offsets (the third input).
GROUPED_MM_OPS = {"aten::_grouped_mm", "aten::_scaled_grouped_mm"}
CONTRACTION_OPS = MATMUL_OPS | CONV_OPS | GROUPED_MM_OPS


@dataclass(frozen=True)
class OpCost:
    """FLOPs (``flop``) and minimum DRAM traffic (``bytes``) of one op call, and its math path;
    ``out_bytes``: the part of ``bytes`` its outputs are (the write that an L2 may still hold when
    the kernel ends: :mod:`gpudiag.analysis.roofline.classify`)."""

    flop: float
    bytes: float
    math_path: str  # bf16, fp16, tf32, fp32, fp64, fp8, int8
    out_bytes: float = 0.0  # of ``bytes``, the outputs written
    k: float = math.nan  # elements: the contraction length of a single GEMM (matmul ops, 1x1 convolutions)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP/byte."""
        return self.flop / self.bytes if self.bytes else math.inf


def storage_ids(value) -> set[str]:
    """Storage addresses of the tensors described in a payload value (empty for captures made
    before gpudiag recorded them)."""
    found = set()
    if isinstance(value, str):
        m = _TENSOR.match(value)
        if m and m.group(3):
            found.add(m.group(3))
    elif isinstance(value, list):
        for v in value:
            found |= storage_ids(v)
    elif isinstance(value, dict):
        for v in value.values():
            found |= storage_ids(v)
    return found


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


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    """Broadcast shape of two leading-dimension lists (numpy rules)."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    return [max(x, y) for x, y in zip(a, b)]


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
    flop, k = None, math.nan  # the matmul branches set k, the contraction length
    if op in ("aten::mm", "aten::matmul") and len(shapes) >= 2 and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        # matmul broadcasts leading dimensions: batch = elements of the output over its last two dims
        m, k, n = shapes[0][-2], shapes[0][-1], shapes[1][-1]
        batch = _numel(_broadcast(shapes[0][:-2], shapes[1][:-2]))
        flop = 2.0 * batch * m * n * k
    elif op == "aten::linear" and len(shapes) >= 2 and len(shapes[1]) == 2:
        # inference mode reaches the dispatcher as linear: x (..., K) times weight (N, K)^T
        (n, k), rows = shapes[1], _numel(shapes[0][:-1])
        flop = 2.0 * rows * n * k
    elif op == "aten::addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1][-2:], shapes[2][-2:]
        flop = 2.0 * m * n * k
    elif op == "aten::bmm" and len(shapes) >= 2 and len(shapes[0]) == 3:
        (b, m, k), n = shapes[0], shapes[1][-1]
        flop = 2.0 * b * m * n * k
    elif op == "aten::baddbmm" and len(shapes) >= 3 and len(shapes[1]) == 3:
        (b, m, k), n = shapes[1], shapes[2][-1]
        flop = 2.0 * b * m * n * k
    elif op in GROUPED_MM_OPS and len(shapes) >= 2 and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        out = outs[0][1] if outs else _grouped_mm_out(shapes)
        flop = None if out is None else _grouped_mm_flop(shapes[0], shapes[1], out)
    elif op in CONV_OPS and outs:
        if op in ("aten::convolution", "aten::_convolution") and len(payload.get("in", [])) > 6 and payload["in"][6] is True:
            return None  # transposed convolution: not modelled
        flop = _conv_flop(op, shapes, [s for _, s in outs])
        if op != "aten::convolution_backward" and len(shapes) > 1 and len(shapes[1]) > 2 and _numel(shapes[1][2:]) == 1:
            k = shapes[1][1]  # a 1x1 convolution is a GEMM over its input channels (per group)
        if dtype == "float32":
            path = "tf32"
    elif op.startswith(SDPA_PREFIXES):
        # forward inputs: query, key, value; backward: grad_out, query, key, value. The
        # scaled_dot_product ops take (B, H, L, D); _flash/_efficient_attention take (B, L, H, D).
        q_at = 1 if "backward" in op else 0
        if len(shapes) > q_at + 1 and len(shapes[q_at]) == 4 and len(shapes[q_at + 1]) == 4:
            if "scaled_dot_product" in op:
                (b, h, l, d), s = shapes[q_at], shapes[q_at + 1][2]
            else:
                (b, l, h, d), s = shapes[q_at], shapes[q_at + 1][1]
            flop = 4.0 * b * h * l * s * d * (2.5 if "backward" in op else 1.0) * _tile_share(op, payload, l, s)
    contraction = flop is not None
    if not contraction:
        largest = float(max(_numel(s) for _, s in ins + outs))
        if op in DATA_MOVEMENT_OPS or op.removesuffix("_backward") in DATA_MOVEMENT_OPS:
            flop = 0.0
        else:
            backward = re.search(r"_backward(_data)?$", op) is not None
            forward = re.sub(r"_backward(_data)?$", "", op)
            per_element = FLOP_PER_ELEMENT.get(forward, 1.0)  # 1: element-wise ops and reductions
            flop = per_element * largest * (2.0 if backward else 1.0)
        path = "fp64" if path == "fp64" else "fp32"  # not a contraction: no tensor cores
    return OpCost(flop=flop, bytes=nbytes, math_path=path, out_bytes=_nbytes(outs), k=float(k) if contraction else math.nan)


# The place of is_causal among each attention op's arguments (aten/src/ATen/native/native_functions.yaml;
# the memory-efficient kernels' custom_mask_type: 0 none, 1 and 2 causal from the top left or bottom right).
ATTENTION_TILE = 128  # elements: FlashAttention-2's and cuDNN's sm90 kernels use 64-128 (_tile_share)
CAUSAL_ARGUMENT = {
    "aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_backward": 11, "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14, "aten::_flash_attention_forward": 8,
    "aten::_flash_attention_backward": 11, "aten::_efficient_attention_forward": 9,
    "aten::_efficient_attention_backward": 14,
}


def _tile_share(op: str, payload: dict, l: int, s: int) -> float:
    """The attention work a fused kernel executes, as a share of the L x S scores: it computes whole
    tiles of :data:`ATTENTION_TILE` x :data:`ATTENTION_TILE` (a sequence not a multiple of the tile
    is padded: more than 1), and with a causal mask (PyTorch's is_causal, aligned top left: query
    row i sees keys 0..i) it skips the key tiles wholly above the diagonal (about half for long
    sequences, all of it for one tile). Measured by Nsight Compute on the H200 (cuDNN's sm90 flash
    kernel, tests/fixtures/roofline48): 0.63 of the full FLOPs for a causal 512-token pass (this
    gives 0.625), 1.0 for a causal 128-token prefill (1.0; exactly half would be 0.50 for both), and
    1.71 for ViT-S's 197 tokens without a mask (this gives (256/197)^2 = 1.69; compiled/vit_compiled)."""
    if l <= 0 or s <= 0:
        return 1.0
    args = payload.get("in", [])
    kwargs = args[-1] if args and isinstance(args[-1], dict) else {}
    at = CAUSAL_ARGUMENT.get(op, -1)
    flag = args[at] if 0 <= at < len(args) - bool(kwargs) else kwargs.get("is_causal", kwargs.get("custom_mask_type"))
    t = ATTENTION_TILE
    q_tiles, k_tiles = -(-int(l) // t), -(-int(s) // t)
    if flag is True or (type(flag) is int and flag > 0):
        # query tile i needs the key tiles up to the one holding key (i + 1) * t - 1
        tiles = sum(min(i + 1, k_tiles) for i in range(q_tiles))
    else:
        tiles = q_tiles * k_tiles
    return tiles * t * t / (float(l) * float(s))


def _grouped_mm_flop(a: list[int], b: list[int], out: list[int]) -> float:
    """FLOPs of a grouped GEMM, 2 per multiply-add: every output element contracts the K of its
    group, K = ``a``'s last dimension; except where ``a`` (M, K) and ``b`` (K, N) are both 2-D: then
    the offsets split K among the groups (a weight gradient, output (G, M, N)) and each output
    element contracts K / G on average. Cases of PyTorch's ``_grouped_mm`` (2-D x 3-D: a mixture of
    experts' forward, rows routed to experts; 3-D x 3-D: a batch; 3-D x 2-D; 2-D x 2-D)."""
    groups = out[0] if len(a) == 2 and len(b) == 2 and len(out) == 3 else 1
    return 2.0 * _numel(out) * a[-1] / max(groups, 1)


def _grouped_mm_out(shapes: list[list[int]]) -> list[int] | None:
    """The output shape of a grouped GEMM whose payload names none (a range pushed before the op
    ran): (M, N) for 2-D x 3-D, (G, M, N) for 3-D x 3-D, and for 2-D x 2-D with G offsets; None
    for another form."""
    a, b = shapes[0], shapes[1]
    if len(a) == 2 and len(b) == 3:
        return [a[0], b[-1]]
    if len(a) == 3 and len(b) == 3:
        return [a[0], a[1], b[-1]]
    if len(a) == 2 and len(b) == 2 and len(shapes) >= 3 and len(shapes[2]) == 1:
        return [shapes[2][0], a[0], b[-1]]
    return None


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
