"""First-cut classification and cost model, on the real captures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gpudiag.analysis.roofline.costmodel import op_cost
from gpudiag.analysis.attribution.families import family_of, kernel_label
from gpudiag.analysis.roofline.peaks import lookup

from conftest import FIXTURES


def payload(op, ins, out):
    return json.dumps({"op": op, "in": ins, "out": out})


def test_contraction_flops_and_bytes():
    mm = op_cost("aten::mm", payload("aten::mm", ["bfloat16[64,128]", "bfloat16[128,256]"], "bfloat16[64,256]"))
    assert mm.flop == 2 * 64 * 128 * 256
    assert mm.bytes == 2 * (64 * 128 + 128 * 256 + 64 * 256)
    assert mm.math_path == "bf16"
    addmm = op_cost("aten::addmm", payload("aten::addmm", ["float32[256]", "float32[64,128]", "float32[128,256]"], "float32[64,256]"))
    assert addmm.flop == 2 * 64 * 128 * 256 and addmm.math_path == "fp32"
    bmm = op_cost("aten::bmm", payload("aten::bmm", ["float16[8,49,32]", "float16[8,32,49]"], "float16[8,49,49]"))
    assert bmm.flop == 2 * 8 * 49 * 49 * 32 and bmm.math_path == "fp16"
    conv = op_cost("aten::convolution", payload("aten::convolution", ["float32[32,3,224,224]", "float32[96,3,4,4]", "float32[96]",
                                                                      [4, 4], [0, 0], [1, 1], False, [0, 0], 1], "float32[32,96,56,56]"))
    assert conv.flop == 2 * 32 * 96 * 56 * 56 * 3 * 4 * 4 and conv.math_path == "tf32"


def test_elementwise_and_reductions_one_flop_per_element_and_unparsable_is_none():
    gelu = op_cost("aten::gelu", payload("aten::gelu", ["bfloat16[32,3136,384]"], "bfloat16[32,3136,384]"))
    n = 32 * 3136 * 384
    assert gelu.flop == n and gelu.bytes == 4 * n and gelu.math_path == "fp32"
    total = op_cost("aten::sum", payload("aten::sum", ["bfloat16[64,1000]", [1]], "bfloat16[64]"))
    assert total.flop == 64 * 1000  # a reduction: one FLOP per input element
    assert op_cost("aten::gelu", "not json") is None
    assert op_cost("aten::empty", payload("aten::empty", [[3, 4]], None)) is None


def test_families_do_not_match_lambda_or_convert():
    lam = "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, [lambda(float, float) (instance 1)]>>>"
    assert family_of(lam) == "reduce"
    assert family_of("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN") == "gemm"
    assert family_of("void convert_layout_kernel<float>") != "conv"
    assert family_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>") == "optimizer"
    # an attention backward's helpers are not attention's matrix products (families.py)
    assert family_of("void cudnn::fusion::compute_dot_do_o_specialized<(bool)1, (int)64>(const void *)") == "reduce"
    assert family_of("void cudnn::fusion::convert_dq_to_16bits<(bool)1>(const void *, void *)") == "copy"
    assert family_of("void cudnn::fusion::fmha_reduce_head<(bool)1>(const void *)") == "reduce"
    assert family_of("void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64>>(Flash_bwd_params)") == "reduce"
    assert family_of("void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64>>(Flash_bwd_params, int)") == "copy"
    assert family_of("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>(Flash_bwd_params)") == "attention"
    assert family_of("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3_64x64x64") == "attention"
    assert kernel_label(lam, "reduce_kernel") == "reduce_kernel · fp32"


def test_peaks_lookup_by_nsys_name():
    h200 = lookup("NVIDIA H200", 132)
    assert h200.bandwidth == 4.8e12 and h200.flops["bf16"] == pytest.approx(989.4e12)
    assert h200.ridge("bf16") == pytest.approx(989.4e12 / 4.8e12)
    assert lookup("NVIDIA H100 PCIe").bandwidth == 2.0e12
    assert lookup("NVIDIA H100 80GB HBM3").bandwidth == 3.35e12
    unknown = lookup("Some Future GPU", 10, 1.0e12)
    assert unknown.bandwidth == 1.0e12 and unknown.flops == {} and "not in the datasheet" in unknown.source


def _classes(db):
    k = pd.read_sql_query("SELECT kernel_id, name, duration_ns FROM kernels", db.conn)
    c = pd.read_sql_query("SELECT * FROM kernel_class", db.conn)
    return k.merge(c, on="kernel_id")


def test_fp32_swin_gemms_are_compute_bound_on_the_fp32_path(analysed):
    """Without autocast, cuBLAS runs SIMT sgemm (sm80_xmma_gemm_f32f32 ... ffma) on the 67 TFLOP/s
    fp32 path, not the tensor cores: most of their time is compute-bound. The exception is Swin's
    window attention bmm, [49,32] x [32,49] per window: 2·49·49·32 FLOP over its fp32 inputs, 4·2·49·32
    bytes (its output stays in the L2): 12.25 FLOP/byte at most, under the fp32 ridge of 14."""
    db, r = analysed("swin_t_train_fp32")
    k = _classes(db).merge(pd.read_sql_query("SELECT kernel_id, op, op_args FROM kernel_attribution", db.conn), on="kernel_id")
    sgemm = k[k["name"].str.contains("gemm_f32f32") & k["name"].str.contains("ffma")]
    assert len(sgemm) > 100
    assert (sgemm["math_path"] == "fp32").all() and (sgemm["evidence"] == "shapes").all()
    time_share = sgemm.groupby("kernel_class")["duration_ns"].sum() / sgemm["duration_ns"].sum()
    assert time_share["compute"] > 0.85
    attention_bmm = k[(k["op"] == "aten::bmm") & k["op_args"].str.contains(",49,32]")]
    assert len(attention_bmm) > 0 and (attention_bmm["kernel_class"] == "bandwidth").all()
    assert (attention_bmm["intensity"] <= 2 * 49 * 49 * 32 / (4 * 2 * 49 * 32) + 1e-9).all()
    assert r["breakdown_percent"]["compute"] > r["breakdown_percent"]["bandwidth"]


def test_bf16_swin_layernorm_is_bandwidth_bound_and_tiny_kernels_overhead(analysed):
    db, r = analysed("swin_t_train_bf16")
    k = _classes(db)
    ln = k[k["name"].str.contains("vectorized_layer_norm_kernel")]
    assert (ln["kernel_class"] == "bandwidth").all() and (ln["family"] == "norm").all()
    assert (ln["intensity"] < ln["ridge"]).all()
    tiny = k[k["duration_ns"] < 2000]
    assert (tiny["kernel_class"] == "overhead").all()
    assert r["classification"]["evidence_share_percent"]["shapes"] > 95


def test_without_op_ranges_classification_falls_back_to_heuristics(analysed):
    db, r = analysed("swin_t_train_bf16_bare")
    k = _classes(db)
    assert set(k["evidence"]) == {"heuristic"}
    gemm = k[k["family"] == "gemm"]
    # a tile side under 64 (roofline/tiles.py) or a product next to an attention softmax
    # (roofline/attention_products.py): bandwidth-bound
    small = gemm["basis"].isin(["small tile", "attention product"])
    assert set(gemm.loc[~small, "kernel_class"]) <= {"compute", "overhead"}
    assert set(gemm.loc[small, "kernel_class"]) <= {"bandwidth", "overhead"}


def test_unrolled_kernels_are_not_roll_copies():
    assert family_of("void at::native::unrolled_elementwise_kernel<at::native::GeluCUDAKernelImpl>") == "elementwise"
    assert family_of("void at::native::roll_cuda_kernel<c10::BFloat16>(const T1 *, T1 *)") == "copy"


def test_measured_peaks_replace_the_datasheet(tmp_path):
    """`gpudiag calibrate` on the H200 (tests/fixtures/h200_calibration.json): the report says it
    used measured peaks, and ridge points and the launch threshold follow them."""
    import json

    from click.testing import CliRunner

    from gpudiag.cli.main import cli
    from conftest import EXPORTS, FIXTURES

    result = CliRunner().invoke(cli, ["report", str(EXPORTS["swin_t_train_bf16"]), "-o", str(tmp_path / "r"), "--json",
                                      "--peaks", str(FIXTURES / "h200_calibration.json")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    calibration = json.loads((FIXTURES / "h200_calibration.json").read_text())
    device = report["device"]
    assert device["peaks_source"].startswith("measured by gpudiag calibrate")
    assert device["memory_bandwidth_bytes_per_s"] == calibration["copy_bytes_per_s"]
    assert device["peak_flop_per_s"]["bf16"] == calibration["matmul_flop_per_s"]["bf16"]
    assert device["peak_flop_per_s"]["fp64"] == 34e12  # not measured: datasheet
    assert device["launch_overhead_ns"] == calibration["launch_overhead_ns"]
    gemm = [k for k in report["top_kernels"] if k["family"] == "gemm" and k["ridge_flop_per_byte"] > 100][0]
    assert gemm["ridge_flop_per_byte"] == pytest.approx(calibration["matmul_flop_per_s"]["bf16"] / calibration["copy_bytes_per_s"])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    wrong = CliRunner().invoke(cli, ["report", str(EXPORTS["tiny_gemm_gelu"]), "-o", str(tmp_path / "b"), "--peaks", str(bad)])
    assert wrong.exit_code == 2 and "not a gpudiag calibration file" in wrong.output


def test_cost_model_per_op_class():
    n = 32 * 3136 * 96
    act = "bfloat16[32,3136,96]"
    assert op_cost("aten::roll", payload("aten::roll", [act, [-3, -3], [1, 2]], act)).flop == 0  # data movement
    assert op_cost("aten::_to_copy", payload("aten::_to_copy", ["float32[96]", {"dtype": "torch.bfloat16"}], "bfloat16[96]")).flop == 0
    ln = op_cost("aten::native_layer_norm", payload("aten::native_layer_norm", [act, [96], "bfloat16[96]", "bfloat16[96]", 1e-5],
                                                     [act, "float32[32,3136,1]", "float32[32,3136,1]"]))
    assert ln.flop == 5 * n and ln.math_path == "fp32"
    ln_bwd = op_cost("aten::native_layer_norm_backward", payload("aten::native_layer_norm_backward", [act, act], [act]))
    assert ln_bwd.flop == 2 * 5 * n
    sm = op_cost("aten::_softmax", payload("aten::_softmax", ["float32[6144,3,49,49]", -1, False], "float32[6144,3,49,49]"))
    assert sm.flop == 5 * 6144 * 3 * 49 * 49
    adamw = op_cost("aten::_fused_adamw_", payload("aten::_fused_adamw_", [{"tensors": 170, "dtype": "float32", "numel": 28_000_000}], None))
    assert adamw.flop == 15 * 28_000_000
    flash = op_cost("aten::_scaled_dot_product_flash_attention",
                    payload("aten::_scaled_dot_product_flash_attention", ["bfloat16[8,12,512,64]"] * 3, ["bfloat16[8,12,512,64]"]))
    assert flash.flop == 4 * 8 * 12 * 512 * 512 * 64 and flash.math_path == "bf16"
    flash_bwd = op_cost("aten::_scaled_dot_product_flash_attention_backward",
                        payload("aten::_scaled_dot_product_flash_attention_backward", ["bfloat16[8,12,512,64]"] * 4, None))
    assert flash_bwd.flop == 2.5 * flash.flop


def test_inference_mode_ops_are_costed():
    """Under torch.inference_mode, linear/conv2d/SDPA reach the dispatcher undecomposed."""
    lin = op_cost("aten::linear", payload("aten::linear", ["bfloat16[4096,1024]", "bfloat16[4096,1024]", "bfloat16[4096]"],
                                          "bfloat16[4096,4096]"))
    assert lin.flop == 2 * 4096 * 4096 * 1024 and lin.math_path == "bf16"
    mm3 = op_cost("aten::matmul", payload("aten::matmul", ["bfloat16[8,12,512,64]", "bfloat16[8,12,64,512]"], "bfloat16[8,12,512,512]"))
    assert mm3.flop == 2 * 96 * 512 * 512 * 64
    conv = op_cost("aten::conv2d", payload("aten::conv2d", ["float32[8,3,32,32]", "float32[16,3,3,3]"], "float32[8,16,30,30]"))
    assert conv.flop == 2 * 8 * 16 * 30 * 30 * 3 * 3 * 3


def test_cost_model_edge_cases():
    sm_bwd = op_cost("aten::_softmax_backward_data", payload("aten::_softmax_backward_data",
                                                           ["float32[64,1000]", "float32[64,1000]", -1, "torch.float32"], "float32[64,1000]"))
    assert sm_bwd.flop == 2 * 5 * 64 * 1000
    bcast = op_cost("aten::matmul", payload("aten::matmul", ["bfloat16[4,1,16,32]", "bfloat16[1,8,32,24]"], "bfloat16[4,8,16,24]"))
    assert bcast.flop == 2 * 32 * 16 * 24 * 32
    flash = op_cost("aten::_flash_attention_forward", payload("aten::_flash_attention_forward",
                                                             ["bfloat16[2,1024,8,64]", "bfloat16[2,512,8,64]", "bfloat16[2,512,8,64]"], None))
    assert flash.flop == 4 * 2 * 8 * 1024 * 512 * 64
    transposed = payload("aten::convolution", ["float32[1,8,4,4]", "float32[8,4,3,3]", None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1],
                         "float32[1,4,6,6]")
    assert op_cost("aten::convolution", transposed) is None


def test_calibration_cache_and_matching(tmp_path, monkeypatch):
    """The cache keeps one entry per GPU and driver, survives a damaged file, and a report picks the
    entry of the GPU it analyses."""
    import json

    from click.testing import CliRunner

    from gpudiag.capture import calibrate
    from gpudiag.cli.main import cli
    from conftest import EXPORTS, FIXTURES

    h200 = json.loads((FIXTURES / "h200_calibration.json").read_text())
    other = {**h200, "gpu": "NVIDIA A100-SXM4-80GB", "copy_bytes_per_s": 1.9e12}
    cache = tmp_path / "calibration.json"
    cache.write_text("{damaged")
    calibrate.save(other, cache)
    calibrate.save(h200, cache)
    assert calibrate.lookup("NVIDIA H200", "580.159.04", cache)["copy_bytes_per_s"] == h200["copy_bytes_per_s"]
    assert calibrate.lookup("NVIDIA H200", "999.0", cache) is None
    export = tmp_path / "swin.sqlite"
    import lzma
    import shutil

    with lzma.open(EXPORTS["swin_t_train_bf16"]) as src, open(export, "wb") as dst:
        shutil.copyfileobj(src, dst)
    result = CliRunner().invoke(cli, ["report", str(export), "-o", str(tmp_path / "r"), "--json", "--peaks", str(cache)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["device"]["memory_bandwidth_bytes_per_s"] == h200["copy_bytes_per_s"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"gpu": "NVIDIA H200", "copy_bytes_per_s": None}))
    bad = CliRunner().invoke(cli, ["report", str(export), "-o", str(tmp_path / "b"), "--peaks", str(broken)])
    assert bad.exit_code == 2 and "not a gpudiag calibration file" in bad.output
