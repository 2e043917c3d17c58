"""Host-side rules (``analysis/rules/host.py``) on what the committed captures do not show
(issue 35 part 6, survivors of a fresh mutation draw): pinned copies from the device to the host
in the pinned rate of GD-PAGEABLE-COPY, and the fused-optimizer kernels of PyTorch's other fused
optimizers (SGD, Adagrad, Adam) in GD-UNFUSED-OPTIMIZER. Each test edits the rule context the
analysis built for a real capture; the oracles are SQL on the run database and the kernel names
of PyTorch's CUDA sources."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from gpudiag.analysis.rules import host


@pytest.fixture
def context(analysed, rule_contexts):
    """Capture name -> (run database, the RuleContext its analysis gave the rules)."""
    _, contexts = rule_contexts

    def get(name: str):
        db, _ = analysed(name)
        return db, contexts[name]

    return get


def _measured_copies(db) -> tuple[pd.DataFrame, int]:
    """The copies launched in a measured step's host range (SQL), and the number of measured steps."""
    steps = pd.read_sql_query("SELECT cpu_start_ns, cpu_end_ns FROM steps WHERE measured", db.conn)
    m = pd.read_sql_query("SELECT m.bytes, m.duration_ns, m.src_kind, m.dst_kind, r.start_ns AS api_ns FROM memcpy m"
                          " JOIN runtime_api r ON r.correlation_id = m.correlation_id AND r.global_pid = m.global_pid",
                          db.conn)
    inside = [any(s.cpu_start_ns <= t < s.cpu_end_ns for s in steps.itertuples()) for t in m["api_ns"]]
    return m[inside], len(steps)


@pytest.mark.parametrize("flipped", ["every other", "all"])
def test_pinned_copies_to_the_host_count_in_the_pinned_rate(context, flipped):
    """input_pipeline_bad copies its batches from pageable memory, input_pipeline_good the same
    batches from pinned memory (12 MB host-to-device copies, H200). The pinned rate is the bytes
    over the time of the pinned copies of 1 MB or more in either direction: with the good run's
    pinned copies turned into device-to-pinned-host copies (source and destination swapped, the
    same bytes and times), every other one or all of them, the saving is the same as with the
    copies as captured: the pageable time less the same bytes at that rate."""
    bad_db, bad = context("input_pipeline_bad")
    good_db, good = context("input_pipeline_good")
    m_bad, n = _measured_copies(bad_db)
    m_good, _ = _measured_copies(good_db)
    pageable = m_bad[(m_bad["src_kind"] == "Pageable") | (m_bad["dst_kind"] == "Pageable")]
    pinned = m_good[(m_good["src_kind"] == "Pinned") & (m_good["bytes"] >= 1e6)]
    assert len(pinned) >= 2 and (m_good.loc[m_good["bytes"] >= 1e6, "dst_kind"] != "Pinned").all()
    rate = pinned["bytes"].sum() / pinned["duration_ns"].sum()
    ns = pageable["duration_ns"].sum() / n
    saving = ns - pageable["bytes"].sum() / n / rate
    assert 0 < saving < ns

    copies = good.memcpy.copy()
    big = copies.index[(copies["src_kind"] == "Pinned") & (copies["bytes"] >= 1e6)]
    assert len(big) == len(pinned)
    swap = big[::2] if flipped == "every other" else big
    copies.loc[swap, ["src_kind", "dst_kind"]] = copies.loc[swap, ["dst_kind", "src_kind"]].to_numpy()
    assert (copies.loc[swap, "dst_kind"] == "Pinned").all() and (copies.loc[swap, "src_kind"] != "Pinned").all()
    rec = host.pageable_copies(dataclasses.replace(bad, memcpy=pd.concat([bad.memcpy, copies], ignore_index=True)))
    assert rec.saving_ns_per_step == pytest.approx(saving, rel=1e-9)
    assert rec.estimate == "pageable copy time minus the same bytes at this run's pinned rate (copies of 1 MB or more)"


# The names nsys gives the kernels of PyTorch's fused optimizers: the AdamW one as captured
# (input_pipeline_good, rmsnorm_train: AdamW(fused=True)); the others built the same way from the
# template arguments in PyTorch's aten/src/ATen/native/cuda/ sources: fused_adam_impl.cu (Adam,
# ADAM_MODE::ORIGINAL = 0), FusedSgdKernel.cu (multi_tensor_apply<2> without momentum, <3> with a
# momentum buffer), fused_adagrad_impl.cu.
_NS = "at::native::<unnamed>::"
FUSED_KERNELS = {
    "AdamW": (f"void {_NS}multi_tensor_apply_kernel<{_NS}FusedOptimizerTensorListMetadata<(int)4>, "
              f"{_NS}FusedAdamMathFunctor<float, (int)4, (at::native::ADAM_MODE)1, (bool)0>, const float *, double, double, "
              "double, double, double, bool, const float *, const float *>(T1, T2, T3...)"),
    "Adam": (f"void {_NS}multi_tensor_apply_kernel<{_NS}FusedOptimizerTensorListMetadata<(int)4>, "
             f"{_NS}FusedAdamMathFunctor<c10::BFloat16, (int)4, (at::native::ADAM_MODE)0, (bool)0>, const float *, double, "
             "double, double, double, double, bool, const float *, const float *>(T1, T2, T3...)"),
    "SGD": (f"void {_NS}multi_tensor_apply_kernel<{_NS}TensorListMetadata<(int)2>, {_NS}FusedSgdMathFunctor<float, (int)2>, "
            "double, double, double, double, bool, bool, bool, const float *, const float *>(T1, T2, T3...)"),
    "SGD with momentum": (f"void {_NS}multi_tensor_apply_kernel<{_NS}TensorListMetadata<(int)3>, "
                          f"{_NS}FusedSgdMathFunctor<float, (int)3>, double, double, double, double, bool, bool, bool, "
                          "const float *, const float *>(T1, T2, T3...)"),
    "Adagrad": (f"void {_NS}multi_tensor_apply_kernel<{_NS}FusedOptimizerTensorListMetadata<(int)3>, "
                f"{_NS}FusedAdagradMathFunctor<float>, const float *, double, double, double, double, bool, const float *, "
                "const float *>(T1, T2, T3...)"),
}


@pytest.mark.parametrize("optimizer", sorted(FUSED_KERNELS))
def test_every_fused_optimizer_kernel_silences_the_rule(context, optimizer):
    """input_pipeline_good's AdamW(fused=True) launches 2 optimizer kernels per step (the fused
    kernel and the step-count add), repeated here to 10 per step. With its fused kernel as any of
    PyTorch's fused optimizers names it, the rule is silent; with that kernel renamed to the step
    count's foreach kernel (no fused kernel left), it fires."""
    db, ctx = context("input_pipeline_good")
    names = pd.read_sql_query("SELECT DISTINCT k.name FROM kernels k JOIN kernel_attribution a USING (kernel_id)"
                              " WHERE a.phase = 'optimizer' AND a.step IN (SELECT step FROM steps WHERE measured)",
                              db.conn)["name"].tolist()
    assert FUSED_KERNELS["AdamW"] in names and len(names) == 2  # the captured name
    foreach = next(n for n in names if n != FUSED_KERNELS["AdamW"])
    opt = ctx.km[ctx.km["phase"] == "optimizer"]
    km = pd.concat([ctx.km] + [opt] * 4, ignore_index=True)
    assert (km["phase"] == "optimizer").sum() == 10 * ctx.n_steps
    fused = km["name"] == FUSED_KERNELS["AdamW"]
    assert fused.sum() == 5 * ctx.n_steps
    renamed = km.assign(name=km["name"].where(~fused, FUSED_KERNELS[optimizer]))
    assert host.unfused_optimizer(dataclasses.replace(ctx, km=renamed)) is None
    unfused = km.assign(name=km["name"].where(~fused, foreach))
    rec = host.unfused_optimizer(dataclasses.replace(ctx, km=unfused))
    assert rec is not None and rec.evidence[0].startswith("10 optimizer kernels/step, ")
