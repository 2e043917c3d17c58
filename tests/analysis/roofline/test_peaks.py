"""Issue 22, MIG: on a slice the peaks are the slice's (its SMs, its memory), and the report says
it ran on one. The oracle is NVIDIA's numbers written out here: H100 SXM 989.4 TFLOP/s bf16 and
3.35 TB/s on 132 SMs and 80 GB; a 1g.10gb slice has 16 SMs and 10 GB (MIG User Guide)."""

from __future__ import annotations

import lzma
import sqlite3

import pytest

from gpudiag.analysis.roofline.peaks import lookup

from conftest import FIXTURES


@pytest.mark.parametrize("name,sms,compute,memory", [
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 16 / 132, 10 / 80),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 0, 3 / 7, 40 / 80),  # SMs not recorded: compute slices of 7
    ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", 132, 1.0, 1.0),
])
def test_a_slice_gets_its_share_of_the_peaks(name, sms, compute, memory):
    whole, part = lookup("NVIDIA H100 80GB HBM3", 132), lookup(name, sms)
    assert part.flops["bf16"] == pytest.approx(989.4e12 * compute)
    assert part.flops["fp32"] == pytest.approx(whole.flops["fp32"] * compute)
    assert part.bandwidth == pytest.approx(3.35e12 * memory)
    assert "MIG slice" in part.source
    # the ridge point moves with both: compute / bandwidth of the slice
    assert part.ridge("bf16") == pytest.approx(whole.ridge("bf16") * compute / memory)


def test_a_whole_gpu_is_not_scaled():
    assert "MIG" not in lookup("NVIDIA H100 80GB HBM3", 132).source


def test_the_report_says_it_ran_on_a_slice(tmp_path):
    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    export = tmp_path / "mig.sqlite"
    db = sqlite3.connect(export)
    db.deserialize(lzma.open(FIXTURES / "tiny_gemm_gelu.sqlite.xz").read())
    db.execute("UPDATE TARGET_INFO_GPU SET name = 'NVIDIA H200 MIG 1g.18gb', smCount = 16")
    db.commit()
    with sqlite3.connect(tmp_path / "copy.sqlite") as out:
        db.backup(out)
    report = analyse(ingest(tmp_path / "copy.sqlite", tmp_path / "run.sqlite"))
    assert any(w.startswith("ran on a MIG slice (NVIDIA H200 MIG 1g.18gb)") for w in report["warnings"])
    assert report["device"]["peak_flop_per_s"]["bf16"] == pytest.approx(989.4e12 * 16 / 132)
    # H200: 4.8 TB/s over 141 GB (the name does not say the GPU's memory: the datasheet does)
    assert report["device"]["memory_bandwidth_bytes_per_s"] == pytest.approx(4.8e12 * 18 / 141)
