"""The math path from kernel names (issue 24): the name table against names recorded in real
exports, and GD-FP32-MATMUL firing from names alone on a real fp32 capture stripped of its op
shapes (as an export made without gpudiag has none)."""

from __future__ import annotations

import lzma
import sqlite3

import pytest

from gpudiag.analysis.roofline.kernel_precision import NAME_MATH_PATHS, math_path_from_name

from conftest import FIXTURES

EXAMPLES = FIXTURES.parents[1] / "examples"

# (demangled name as recorded, the math path it runs on: the capture's dtype, the library's naming)
RECORDED = [
    # cuBLAS / cuDNN xmma, fp32 FFMA (examples/swin_t_train_fp32, trials/t5_h100: fp32 lm_head)
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "fp32"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x128x8_stage3_warpsize2x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn", "fp32"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)", "fp32"),
    ("void gemmSN_NN_kernel<float, (int)256, (int)4, (int)2, (int)8, (int)4, (int)4, (bool)1, "
     "cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<const float>>", "fp32"),
    # cuDNN on Hopper, fp32 tensors with cuDNN's default allow_tf32 (trials/convnext_h100, 2026-11-25)
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x192x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn", "tf32"),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize1x1x4_g16_tensor16x8x8_execute_kernel__5x_cudnn", "tf32"),
    # cuBLAS fp32 FFMA in ViT-S fp32 training (trials/vit_h100)
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "fp32"),
    # bf16 (zoo/resnet50, llama, swin bf16)
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn", "bf16"),
    ("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_TNN", "bf16"),
    ("nvjet_sm90_tss_128x128_64x4_1x2_h_bz_NNT", "bf16"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_32x1_nn_align1>(T1::Params)", "bf16"),
    ("void cutlass::Kernel2<cutlass_75_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_nn_align1>(T1::Params)", "bf16"),
    ("void precomputed_convolve_sgemm<__nv_bfloat16, (int)128, (int)6, (int)7, (int)3, (int)3, (int)5, (int)1, (bool)0>", "bf16"),
    ("void gemmSN_TN_kernel<float, (int)128, (int)16, (int)2, (int)4, (int)4, (int)4, (bool)1, "
     "cublasGemvTensorStridedBatched<const __nv_bfloat16>, cublasGemvTensorStridedBatched<const __nv_bfloat16>>", "bf16"),
    # fp16 (tiny_gemm_gelu: c10::Half elementwise kernels around it)
    ("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", "fp16"),
]


@pytest.mark.parametrize("name,path", RECORDED)
def test_recorded_names(name, path):
    assert math_path_from_name(name) == path


def test_recorded_names_are_in_the_exports():
    """The table's names are the exports' own (short tile sizes aside): the capture of each family."""
    seen = set()
    for export in (EXAMPLES / "swin_t_train_fp32.sqlite.xz", EXAMPLES / "swin_t_train_bf16.sqlite.xz",
                   FIXTURES / "tiny_gemm_gelu.sqlite.xz", FIXTURES / "zoo" / "resnet50.sqlite.xz",
                   FIXTURES / "trials" / "convnext_h100" / "profile.sqlite.xz",
                   FIXTURES / "trials" / "vit_h100" / "profile.sqlite.xz"):
        db = sqlite3.connect(":memory:")
        db.deserialize(lzma.open(export).read())
        seen |= {r[0] for r in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                          "JOIN StringIds s ON s.id = k.demangledName")}
    prefixes = {name.split("_tilesize")[0].split("_64x")[0].split("_128x")[0].split("_192x")[0].split("_256x")[0]
                for name, _ in RECORDED if "xmma" in name or name.startswith("nvjet")}
    assert all(any(s.startswith(p) for s in seen) for p in prefixes), prefixes


def test_names_without_a_type_are_unknown():
    for name in ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>>",
                 "triton_poi_fused_add_0", "ampere_gemm_generic"):
        assert math_path_from_name(name) is None
    assert len({p for _, p in NAME_MATH_PATHS}) == 5  # fp8, tf32, bf16, fp16, fp32


def test_fp32_matmul_fires_from_names_alone(tmp_path):
    """examples/swin_t_train_fp32 without its op ranges: no shapes, yet its fp32 FFMA GEMMs and
    convolutions are found by name and GD-FP32-MATMUL fires, with the same time as with shapes."""
    from test_kernel_sequence import strip_op_ranges

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    full, stripped = tmp_path / "full.sqlite", tmp_path / "stripped.sqlite"
    assert strip_op_ranges(EXAMPLES / "swin_t_train_fp32.sqlite.xz", stripped) > 100
    with lzma.open(EXAMPLES / "swin_t_train_fp32.sqlite.xz") as src:
        full.write_bytes(src.read())
    with_shapes = analyse(ingest(full, tmp_path / "full.run.sqlite"))
    by_name = analyse(ingest(stripped, tmp_path / "stripped.run.sqlite"))
    rec = {r["rule_id"]: r for r in by_name["recommendations"] + by_name["suppressed"]}["GD-FP32-MATMUL"]
    assert "read from the kernel names" in rec["evidence"][0]
    reference = {r["rule_id"]: r for r in with_shapes["recommendations"] + with_shapes["suppressed"]}["GD-FP32-MATMUL"]
    assert "read from the kernel names" not in reference["evidence"][0]
    # by name it may count a few more kernels (heuristic class): never fewer, at most 25 % more
    assert reference["saving_ns_per_step"] <= rec["saving_ns_per_step"] <= 1.25 * reference["saving_ns_per_step"]
