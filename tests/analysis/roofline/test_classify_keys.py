"""The classification's building blocks (``analysis/roofline/classify.py``) on what the committed
captures do not hold (issue 35 part 6, survivors of fresh mutation draws): the launch-configuration
key against the pandas groupby it replaces (NULL names, categorical names, a key past int64), the
class text in both of pandas' text storages, the shape costs of a step without op shapes, and a
kernel whose math path has no known peak. The oracles are pandas' own groupby and the rules of
design.md written out here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag import store
from gpudiag.analysis.roofline import classify as cl
from gpudiag.analysis.attribution.families import CONTRACTION_FAMILIES

GRID = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _oracle(kernels: pd.DataFrame) -> list[int]:
    """What _config_key's docstring promises: groupby(CONFIG_COLUMNS, sort=False, dropna=False).ngroup(),
    numbering the configurations in order of first appearance, a NULL a value of its own."""
    cols = kernels[cl.CONFIG_COLUMNS].astype(object)
    return cols.groupby(cl.CONFIG_COLUMNS, sort=False, dropna=False).ngroup().tolist()


def _frame(names, grids) -> pd.DataFrame:
    return pd.DataFrame({"name": names, **{c: [g[i] for g in grids] for i, c in enumerate(GRID)}})


_names = st.lists(st.sampled_from(["gemm", "relu", "b_reduce", "a_copy", None]), min_size=1, max_size=40)
_grid = st.sampled_from([1.0, 2.0, 64.0, np.nan])


@settings(max_examples=60, deadline=None)
@given(names=_names, data=st.data(), categorical=st.booleans())
def test_the_config_key_numbers_configurations_as_the_groupby_does(names, data, categorical):
    """Kernel names as text or categorical (as ingest gives them), with NULL names and NULL grid
    values: one code per distinct configuration, in order of first appearance, equal to the groupby."""
    grids = data.draw(st.lists(st.tuples(*[_grid] * 6), min_size=len(names), max_size=len(names)))
    kernels = _frame(names, grids)
    if categorical:
        kernels["name"] = kernels["name"].astype("category")
    assert cl._config_key(kernels).tolist() == _oracle(kernels)


@pytest.mark.parametrize("categorical", [False, True])
def test_a_config_key_past_int64_stays_one_code_per_configuration(categorical):
    """1024 distinct values in each of the seven columns make the mixed-radix code 1024**7 = 2**70, past
    int64: without renumbering on the way, the name's code would be multiplied by 2**60 and wrap,
    and a row differing from row 0 only by a name 16 codes on would share row 0's code. It must not."""
    n = 1024
    names = [f"k{i}" for i in range(n)]
    kernels = _frame(names + [names[16]], [tuple(float(i) for _ in GRID) for i in range(n)] + [(0.0,) * 6])
    if categorical:
        kernels["name"] = pd.Categorical(kernels["name"], categories=names)
    key = cl._config_key(kernels)
    assert key.tolist() == _oracle(kernels)
    assert key.iloc[-1] != key.iloc[0] and key.nunique() == n + 1


@pytest.mark.parametrize("storage", ["pandas' text dtype", "object"])
def test_class_text_is_the_labels_taken_by_code(monkeypatch, storage):
    """_text(labels, codes) is labels[codes], in pandas' own text dtype where pandas has one, else as
    Python strings (pandas without Arrow)."""
    if storage == "object":
        monkeypatch.setattr(cl, "_TEXT", np.dtype(object))
    out = cl._text(cl.CLASSES, np.array([2, 0, 0, 1, 2]))
    assert list(out) == ["bandwidth", "overhead", "overhead", "compute", "bandwidth"]
    assert out.dtype == (pd.Series(["x"]).dtype if storage != "object" else np.dtype(object))


def test_shape_costs_of_a_step_without_op_shapes_are_an_empty_frame_of_its_columns():
    """No kernel launched by an op call with recorded shapes (op_call -1): no costs, but the
    documented columns (flop, bytes, math_path)."""
    kernels = pd.DataFrame({"duration_ns": [5_000, 7_000]})
    attribution = pd.DataFrame({"op": ["", ""], "op_args": ["", ""], "op_call": [-1, -1]})
    out = cl._shape_costs(kernels, attribution, pd.Series(["gemm", "elementwise"]))
    assert out.empty and list(out.columns) == ["flop", "bytes", "math_path"]


def test_a_kernel_whose_math_path_has_no_known_peak_is_classified_by_its_name(analysed):
    """design.md: without a ridge the roofline cannot place a kernel. On a device that lists no peak
    for the math path of rmsnorm_train's shaped GEMMs, those kernels get no ridge and are classified
    by their family (contractions compute-bound, the rest bandwidth-bound), evidence heuristic; the
    other shaped kernels keep the roofline."""
    from gpudiag.analysis.roofline import peaks

    db, report = analysed("rmsnorm_train")
    kernels, attribution = (pd.read_sql_query(f"SELECT * FROM {t} ORDER BY kernel_id", db.conn)
                            for t in ("kernels", "kernel_attribution"))
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    before = cl.classify(kernels, attribution, device)
    long_enough = kernels["duration_ns"] >= device.launch_overhead_ns
    gemm = (before["family"].isin(CONTRACTION_FAMILIES) & (before["evidence"] == "shapes") & long_enough).to_numpy()
    assert gemm.any()
    path = before.loc[gemm, "math_path"].iloc[0]
    blind = dataclasses.replace(device, flops={k: v for k, v in device.flops.items() if k != path})
    out = cl.classify(kernels, attribution, blind)
    lost = (before["math_path"] == path).to_numpy() & long_enough.to_numpy()
    assert lost.any() and (~lost & (before["evidence"] == "shapes").to_numpy()).any()
    assert out.loc[lost, "ridge"].isna().all() and (out.loc[lost, "evidence"] == "heuristic").all()
    by_name = np.where(out.loc[lost, "family"].isin(CONTRACTION_FAMILIES), "compute", "bandwidth")
    assert (out.loc[lost, "kernel_class"].to_numpy() == by_name).all()
    kept = ~lost & (before["evidence"] == "shapes").to_numpy()
    pd.testing.assert_frame_equal(out[kept], before[kept])


def test_communication_kernels_are_outside_the_roofline(tmp_path):
    """Collective kernels (NCCL's, family communication) are class communication with heuristic
    evidence and no roofline number, whatever op launched them: a DDP step of GPT-2 on two H100s
    (tests/fixtures/nccl/gpt_ddp_shm, rank 0), read back from the run database with SQL; the other
    kernels keep their classes."""
    import lzma
    import shutil

    from conftest import FIXTURES

    from gpudiag.analysis.ingest import ingest
    from gpudiag.analysis.pipeline import analyse

    export = tmp_path / "profile.sqlite"
    with lzma.open(FIXTURES / "nccl" / "gpt_ddp_shm" / "profile.sqlite.xz") as src, open(export, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = ingest(export, tmp_path / "run.sqlite")
    analyse(db)
    k = store.read_table(db, "kernel_class")
    comm = k[k["family"] == "communication"]
    assert len(comm) and (k["kernel_class"] == "communication").sum() == len(comm)
    assert (comm["evidence"] == "heuristic").all() and comm["math_path"].isna().all()
    roof = ["flop", "bytes", "intensity", "ridge", "achieved_flop_per_s", "achieved_bytes_per_s", "efficiency"]
    assert comm[roof].isna().all().all()
    assert set(k.loc[k["family"] != "communication", "kernel_class"]) <= {"compute", "bandwidth", "overhead"}


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 7.0, np.nan]), st.integers(0, 5)), min_size=1, max_size=40))
def test_the_instance_index_is_the_launchs_ordinal_within_its_step(rows):
    """(config_key, n) for the n-th launch of a configuration within its step: what
    ``groupby([step, config_key]).cumcount()`` gives, a kernel outside every step (NULL step) with no
    ordinal (NaN), so it is matched to no detail-step launch."""
    step = pd.Series([s for s, _ in rows])
    config_key = pd.Series([c for _, c in rows], dtype=np.int64)
    index = cl._instance_index(config_key, step)
    expected = config_key.groupby([step.to_numpy(), config_key.to_numpy()]).cumcount()
    assert index.get_level_values(0).tolist() == config_key.tolist()
    np.testing.assert_array_equal(index.get_level_values(1).to_numpy(dtype=float), expected.to_numpy(dtype=float))


def test_an_op_call_the_cost_model_cannot_read_gives_its_kernels_no_cost():
    """Kernels launched by an op call whose shapes the cost model cannot read (a payload that is not
    JSON: op_cost gives None) get no FLOPs, bytes or math path, while a readable call's kernels get
    the call's cost shared by duration."""
    from gpudiag.analysis.roofline.costmodel import op_cost

    import json

    args = json.dumps({"op": "aten::gelu", "in": ["bfloat16[32,384]"], "out": "bfloat16[32,384]"})
    assert op_cost("aten::gelu", "not json") is None
    cost = op_cost("aten::gelu", args)
    assert cost is not None and cost.bytes > 0 and cost.flop > 0
    kernels = pd.DataFrame({"duration_ns": [1_000, 3_000, 2_000]})
    attribution = pd.DataFrame({"op": ["aten::gelu"] * 3, "op_args": ["not json", args, args], "op_call": [0, 1, 1]})
    out = cl._shape_costs(kernels, attribution, pd.Series(["elementwise"] * 3))
    assert list(out.index) == [1, 2]
    assert out["bytes"].tolist() == pytest.approx([cost.bytes * 0.6, cost.bytes * 0.4], rel=1e-12)
    assert out["flop"].tolist() == pytest.approx([cost.flop * 0.6, cost.flop * 0.4], rel=1e-12)
    assert out["math_path"].tolist() == [cost.math_path] * 2


def test_a_kernel_without_a_grid_size_counts_as_one_block_per_missing_dimension(analysed):
    """design.md's overhead rule counts a kernel's blocks (grid_x * grid_y * grid_z) against the SMs;
    a grid dimension the export left NULL counts as 1. rmsnorm_train's kernels with grid_y and
    grid_z made NULL and grid_x one under the SM count: each one shorter than a launch is
    overhead-bound (fewer blocks than SMs), as with grid_y = grid_z = 1."""
    from gpudiag.analysis.roofline import peaks

    db, report = analysed("rmsnorm_train")
    kernels, attribution = (pd.read_sql_query(f"SELECT * FROM {t} ORDER BY kernel_id", db.conn)
                            for t in ("kernels", "kernel_attribution"))
    device = peaks.lookup(report["device"]["name"], report["device"]["sm_count"])
    short = (kernels["duration_ns"] < device.launch_overhead_ns) & (kernels["duration_ns"] >= device.launch_overhead_ns / 2)
    assert short.any()
    ones = kernels.assign(grid_x=np.where(short, device.sm_count - 1, kernels["grid_x"]))
    ones.loc[short, ["grid_y", "grid_z"]] = 1
    nulls = ones.copy()
    nulls[["grid_y", "grid_z"]] = nulls[["grid_y", "grid_z"]].astype(float)
    nulls.loc[short, ["grid_y", "grid_z"]] = np.nan
    with_ones, with_nulls = cl.classify(ones, attribution, device), cl.classify(nulls, attribution, device)
    assert (with_nulls.loc[short, "kernel_class"] == "overhead").all()
    assert with_nulls["kernel_class"].tolist() == with_ones["kernel_class"].tolist()
