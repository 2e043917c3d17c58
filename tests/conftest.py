"""Shared fixtures: the real Swin-T captures (H200, see tests/fixtures/capture_swin.sh),
decompressed and analysed once per session."""

from __future__ import annotations

import os

# Triton kernels run in Triton's interpreter on CPU tensors (set before anything imports triton).
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import lzma
import shutil
from pathlib import Path

import pytest

from gpudiag import store
from gpudiag.analysis.ingest import ingest
from gpudiag.analysis.pipeline import analyse

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXPORTS = {
    "swin_t_train_bf16": ROOT / "examples" / "swin_t_train_bf16.sqlite.xz",
    "swin_t_train_fp32": ROOT / "examples" / "swin_t_train_fp32.sqlite.xz",
    "swin_t_train_bf16_repeat": FIXTURES / "swin_t_train_bf16_repeat.sqlite.xz",
    "swin_t_train_bf16_bare": FIXTURES / "swin_t_train_bf16_bare.sqlite.xz",
    "swin_t_train_bf16_crash": FIXTURES / "swin_t_train_bf16_crash.sqlite.xz",
    "tiny_gemm_gelu": FIXTURES / "tiny_gemm_gelu.sqlite.xz",
    "gpt2_train_bf16": ROOT / "examples" / "gpt2_train_bf16.sqlite.xz",
    "mlp_decode": FIXTURES / "mlp_decode.sqlite.xz",
    "input_pipeline_bad": FIXTURES / "input_pipeline_bad.sqlite.xz",
    "input_pipeline_good": FIXTURES / "input_pipeline_good.sqlite.xz",
    "mlp_inference_b4096": FIXTURES / "mlp_inference_b4096.sqlite.xz",
    "kernel_pathologies": FIXTURES / "kernel_pathologies.sqlite.xz",
    "rmsnorm_train": FIXTURES / "rmsnorm_train.sqlite.xz",
    "towers_inference": FIXTURES / "towers_inference.sqlite.xz",
    "mlp_chain_b4096": FIXTURES / "mlp_chain_b4096.sqlite.xz",
    # Swin-T bf16 recaptured with storage addresses (data flow), timm 1.0.29; capture_swin.sh
    "swin_t_train_bf16_dataflow": FIXTURES / "swin_t_train_bf16_dataflow.sqlite.xz",
    # the same at batch 128, GPU-bound (benchmarks/run_swin_batch128.sh)
    "swin_t_train_bf16_b128": FIXTURES / "swin_t_train_bf16_b128.sqlite.xz",
    # the workload zoo (benchmarks/zoo, H100), with their script status next to them
    **{f"zoo_{p.name.split('.')[0]}": p for p in sorted((FIXTURES / "zoo").glob("*.sqlite.xz"))},
}
NCU_REPORTS = {
    "mlp_decode": FIXTURES / "mlp_decode.ncu-rep.xz",  # gpudiag profile --ncu, same run as the export
    "kernel_pathologies": FIXTURES / "kernel_pathologies.ncu-rep.xz",  # same run as the export
    "mlp_inference_b4096": FIXTURES / "mlp_inference_b4096.ncu-rep.xz",  # same run as the export
    "swin_t_train_bf16": FIXTURES / "swin_t_train_bf16_step2.ncu-rep.xz",  # explored with capture_ncu.sh
}


def _decompressing(folder: Path, sources: dict[str, Path], suffix: str):
    """name -> path of the decompressed copy of ``sources[name]`` in ``folder`` (made once)."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            target = folder / f"{name}{suffix}"
            with lzma.open(sources[name]) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            cache[name] = target
        return cache[name]

    return get


@pytest.fixture(scope="session")
def export_path(tmp_path_factory):
    """Function name -> path of the decompressed export (cached for the session)."""
    return _decompressing(tmp_path_factory.mktemp("exports"), EXPORTS, ".sqlite")


def status_of(name: str) -> dict | None:
    path = FIXTURES / "status" / f"{name}.json"
    zoo = FIXTURES / "zoo" / f"{name.removeprefix('zoo_')}.status.json.xz"
    if name.startswith("zoo_") and zoo.exists():
        return json.loads(lzma.open(zoo, "rt").read())
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="session")
def ncu_path(tmp_path_factory):
    """Function name -> path of the decompressed Nsight Compute report (cached)."""
    return _decompressing(tmp_path_factory.mktemp("ncu"), NCU_REPORTS, ".ncu-rep")


def _mutation_run() -> bool:
    """Whether mutmut (scripts/mutation.sh) is learning which tests reach which function: then every
    test analyses its capture itself. With the session's cache only the first test of a capture
    would be seen to reach the analysis, and the others would never run on a mutant. (Each mutant's
    own run is a new session, so the cache holds that mutant's analysis only.)"""
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


# name -> the RuleContext the analysis of that capture gave the rules (tests/analysis/rules/test_base.py
# calls the rules on it), recorded by `analysed`
RULE_CONTEXTS: dict[str, object] = {}


def analyse_recording(db, name: str, status: dict | None, **kwargs) -> dict:
    """``analyse(db, status=status)``, recording the rules' context in RULE_CONTEXTS[name]; the
    derived tables then also SQL tables of ``db.conn`` (:func:`gpudiag.store.queryable`), as the
    tests read them."""
    import gpudiag.analysis.findings.recommendations as findings

    seen = []
    original = findings.recommend_split
    findings.recommend_split = lambda ctx: seen.append(ctx) or original(ctx)
    try:
        report = analyse(db, status=status, **kwargs)
    finally:
        findings.recommend_split = original
    RULE_CONTEXTS[name] = seen[-1] if len(seen) == 1 else None
    store.queryable(db)
    return report


@pytest.fixture(scope="session")
def rule_contexts():
    """(analyse_recording, RULE_CONTEXTS) of this module (a test module's ``import conftest`` may
    load a second copy of it, with a dict of its own)."""
    return analyse_recording, RULE_CONTEXTS


@pytest.fixture(scope="session")
def analysed(export_path, tmp_path_factory):
    """Function name -> (run database, report dict) of the analysed capture (cached)."""
    folder = tmp_path_factory.mktemp("runs")
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache or _mutation_run():
            db = ingest(export_path(name), folder / f"{name}.run.sqlite")
            cache[name] = (db, analyse_recording(db, name, status_of(name)))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def analysed_with_ncu(export_path, ncu_path, tmp_path_factory):
    """Function name -> (run database, report dict) of a capture analysed with its ncu report."""
    folder = tmp_path_factory.mktemp("runs_ncu")
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache or _mutation_run():
            db = ingest(export_path(name), folder / f"{name}.run.sqlite", ncu_path=ncu_path(name))
            cache[name] = (db, analyse(db, status=status_of(name)))
            store.queryable(db)
        return cache[name]

    return get
