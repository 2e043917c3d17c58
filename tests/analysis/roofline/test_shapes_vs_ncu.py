"""Issue 48, "with gpudiag profile's shapes, no fixture loses agreement": the six held-out workloads
captured again under ``gpudiag profile`` on the same H200 (op ranges and shapes on its detail step;
benchmarks/roofline48/shapes.sh, 2026-11-28), classed from their shapes and checked against the
Nsight Compute numbers of the same workload (``ncu_truth.csv.xz``), with benchmarks/roofline_accuracy.py's
own comparison; the same comparison without shapes runs on the plain nsys exports."""

from __future__ import annotations

import json
import lzma
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT
from gpudiag.analysis.roofline.costmodel import op_cost
from gpudiag.analysis.roofline.kernel_precision import simt_math_path

sys.path.insert(0, str(ROOT / "benchmarks"))
import roofline_accuracy  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "roofline48"
NAMES = ("conv", "swinv2", "encoder", "decoder", "decode", "moe", "decoder_eager", "triton_gemm", "bert_eager",
         "gpt2_eager")
# its GEMMs run in an Inductor graph, outside any aten op range; its shapes run predates the shapes compiled
# call sites record (test_compiled_shapes_vs_ncu.py checks those, on a gpudiag profile --ncu run)
COMPILED = {"triton_gemm"}


def _accuracy(tmp_path: Path, name: str, shapes: bool) -> dict:
    run = tmp_path / f"{name}-{shapes}"
    run.mkdir()
    source = FIXTURES / name / "shapes" if shapes else FIXTURES / name
    for f in ("profile.sqlite.xz", "script_status.json"):
        if (source / f).exists():
            shutil.copy(source / f, run / f)
    shutil.copy(FIXTURES / name / "ncu_truth.csv.xz", run / "ncu_truth.csv.xz")
    return roofline_accuracy.accuracy(run)


@pytest.mark.parametrize("name", NAMES)
def test_shapes_agree_with_ncu_at_least_as_well_as_the_names(tmp_path, name):
    """Time-weighted class agreement with ncu: with shapes at least 97 % on every fixture and not below
    the agreement without shapes. The GEMMs' estimated FLOPs match ncu's to 30 % (median; the FLOPs of
    a call with several kernels are shared by duration)."""
    with_shapes = _accuracy(tmp_path, name, True)
    without = _accuracy(tmp_path, name, False)
    got, before = with_shapes["agreement_time_weighted_percent"], without["agreement_time_weighted_percent"]
    assert got >= 97.0, with_shapes["disagreements"]
    assert got >= before - 0.05, (got, before, with_shapes["disagreements"])
    if name not in COMPILED:
        assert with_shapes["contraction_flop_error_median_percent"] <= 30.0, with_shapes


@pytest.mark.parametrize("name", [n if n not in COMPILED else pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason="Triton GEMMs of small K or N: no signal of K in a template's name, launch or duration "
    "(issue 48; test_gemm_tiles.py::test_a_triton_gemm_s_export_fields_do_not_decide_its_class)"))
    for n in NAMES])
def test_without_shapes_the_class_agrees_with_ncu_for_95_percent_of_kernel_time(tmp_path, name):
    """Issue 48's bar on the exports made without gpudiag: time-weighted agreement with ncu of at
    least 95 %. Missed on the Triton workload (94.3 %): its small-K/N template GEMMs
    (``triton_tem_fused__to_copy_add_addmm_t_14``, 10.6 FLOP/byte by ncu) are classed compute-bound
    by family, as its large ones (954 FLOP/byte) rightly are."""
    without = _accuracy(tmp_path, name, False)
    assert without["agreement_time_weighted_percent"] >= 95.0, without["disagreements"]


def _payloads(name: str, op: str) -> list[str]:
    """The recorded payloads of ``op`` in a fixture's export made by gpudiag profile."""
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.sqlite"
        with lzma.open(FIXTURES / name / "shapes" / "profile.sqlite.xz") as f, open(db, "wb") as g:
            shutil.copyfileobj(f, g)
        con = sqlite3.connect(db)
        try:
            rows = con.execute("SELECT DISTINCT s.value FROM NVTX_EVENTS e JOIN StringIds s ON e.textId = s.id "
                               "WHERE s.value LIKE ?", (f"%{op}%",)).fetchall()
            rows += con.execute("SELECT DISTINCT text FROM NVTX_EVENTS WHERE text LIKE ?", (f"%{op}%",)).fetchall()
        finally:
            con.close()
    return [r[0] for r in rows if r[0]]


def test_a_grouped_gemm_counts_two_flop_per_multiply_add_of_every_group():
    """torch._grouped_mm in the MoE fixture (x (8192, 768) routed to 8 experts' (768, 3072) weights):
    2·M·N·K, as ncu measured it: the 8 expert GEMMs of one call did, in ncu's first step, about
    the same total (each row of x goes to one expert). The ranges pushed before the op ran name no
    output: the output shape is then inferred from the inputs."""
    payloads = [p[p.index("{"):] for p in _payloads("moe", "aten::_grouped_mm") if "{" in p]
    assert payloads, "the MoE fixture records its grouped GEMMs"
    for text in payloads:
        payload = json.loads(text)
        a, b = (json.loads(json.dumps(x)) for x in payload["in"][:2])
        m, k = (int(v) for v in a[a.index("[") + 1:a.index("]")].split(","))
        dims_b = [int(v) for v in b[b.index("[") + 1:b.index("]")].split(",")]
        cost = op_cost("aten::_grouped_mm", text)
        assert cost.flop == 2.0 * m * k * dims_b[-1] and cost.math_path == "fp32"  # float32 inputs: SIMT
    truth = pd.read_csv(FIXTURES / "moe" / "ncu_truth.csv.xz")
    expert = truth[truth["name"].str.contains("xmma_gemm_f32f32")]
    # the first call of the step (8 expert GEMMs in a row): 2 x 8192 x 768 x 3072 FLOP in all, to 10 %
    first = expert.iloc[:8]
    assert first["flop"].sum() == pytest.approx(2.0 * 8192 * 768 * 3072, rel=0.10)
    assert (first["flop_tensor"] == 0).all()


def test_a_two_d_grouped_gemm_splits_k_among_its_groups():
    """A weight gradient: x^T (768, 8192) and the output gradient (8192, 3072), K = 8192 split by
    the offsets among 8 experts, output (8, 768, 3072): 2·768·3072·8192 FLOP in all, not 8 times it."""
    text = json.dumps({"op": "aten::_grouped_mm", "in": ["bfloat16[768,8192]", "bfloat16[8192,3072]", "int32[8]"],
                       "out": "bfloat16[8,768,3072]"})
    assert op_cost("aten::_grouped_mm", text).flop == 2.0 * 768 * 3072 * 8192


def test_a_bf16_convolution_run_as_an_sgemm_is_held_to_the_fp32_roof():
    """The kernel decides the roof, not the op's dtype: the stem convolution of EfficientNet-B0 and
    Swin-V2's patch embedding are bf16 ops cuDNN runs on the SIMT cores; ncu measured 0 tensor-core
    FLOPs for both (the oracle); gpudiag now holds them to the fp32 roof (their ``ridge``) while
    ``math_path`` stays bf16, the op's precision the precision rules read."""
    truth = pd.concat([pd.read_csv(FIXTURES / n / "ncu_truth.csv.xz") for n in ("conv", "swinv2")])
    simt = truth[truth["name"].str.contains("convolve_common_engine_float|precomputed_convolve_sgemm")]
    assert len(simt) >= 2 and (simt["flop_tensor"] == 0).all() and (simt["flop_fp32"] > 0).all()
    names = pd.Series(list(simt["name"]) + ["nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"])
    paths = simt_math_path(names, pd.Series(["bf16"] * len(names)))
    assert list(paths) == ["fp32"] * len(simt) + ["bf16"]


def test_a_gemm_output_that_fits_in_l2_is_not_dram_traffic(tmp_path):
    """The decoder's 4096x1024x256 bf16 GEMM (``aten::mm``, ``nvjet_…_128x64_64x8_1x2_h_bz_TNT``): its
    inputs are 2 x (4096 x 1024 + 1024 x 256) bytes, its output 2 x 4096 x 256 (2.1 MB, under the H200's
    60 MB L2 the export names). ncu (the oracle) counts its inputs only; the shapes now do too, so its
    intensity (240 FLOP/byte) is over the bf16 ridge, as ncu found, not under it (195 with the output)."""
    (tmp_path / "unpacked").mkdir()
    est = roofline_accuracy.classes(roofline_accuracy._unpacked(FIXTURES / "decoder" / "shapes", tmp_path / "unpacked"),
                                    False, tmp_path)
    gemm = est[est["name"].str.contains("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT") & est["evidence"].eq("shapes")]
    inputs = 2.0 * (4096 * 1024 + 1024 * 256)
    assert len(gemm) > 0 and (gemm["bytes"] == inputs).all() and (gemm["flop"] == 2.0 * 4096 * 1024 * 256).all()
    truth = pd.read_csv(FIXTURES / "decoder" / "ncu_truth.csv.xz")
    measured = truth.loc[truth["name"].str.contains("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"), "dram_bytes"]
    assert measured.median() == pytest.approx(inputs, rel=0.01)
    assert (gemm["kernel_class"].isin(["compute", "overhead"])).all()
