"""Inference read per request: latency percentiles, samples/s, start-up, and for ``generate()``
time to first token (TTFT), time per output token (TPOT) and tokens/s.

A step of an inference script is one request or batch (``gpudiag.capture.call_steps``: one
outermost forward or one ``generate()`` call; or the user's own step ranges). The numbers come from
the run without the profiler when ``gpudiag profile`` made one (tracing inflates host time: see
:mod:`gpudiag.analysis.steps.representative`), else from the profiled run, and the report says which.

Per-step times are CUDA-event times between the step boundaries where the run recorded them, else
host wall-clock times (the same choice as the bare-run comparison). Percentiles are NumPy's linear
interpolation over the measured steps: with 20 steps, p99 is close to the slowest step, and the
report gives the step count beside it.

Generation (docs/inference.md): step k's forwards start at offsets o_0 (prefill) … o_{n-1} from
the step's start. The first token exists once the prefill forward has run and the next forward
starts, so TTFT = o_1; TPOT = (step time − o_1) / (n − 1), the decode forwards' average including
the host work between them; tokens per step = n × samples per step (``generate()`` runs one
forward per new token: prefill gives the first); tokens/s = tokens per step ÷ step time.
"""

from __future__ import annotations

import numpy as np

from gpudiag.analysis.steps.representative import _times  # the bare-run comparison's per-step reading
from gpudiag.script_status import ScriptStatus

PERCENTILES = (50, 90, 99)


def is_inference(status: ScriptStatus | dict | None) -> bool:
    """True for a run whose steps are requests: forward or generate() steps, or any steps with no
    ``backward()`` call recorded (no loss kept). False without a launcher status (an export), and
    for steps that called ``backward()`` (forward steps of a training loop with no torch.optim
    optimizer, such as pytorch/examples word_language_model's hand-written SGD update)."""
    status = ScriptStatus.of(status)
    if status is None or not status.step_mode or status.losses:
        return False
    # a status without the "losses" key predates their recording: nothing says it is inference
    return status.step_mode in ("forward", "generate") or status.losses is not None


def serving_context(status: ScriptStatus | dict | None) -> dict | None:
    """What the inference rules read (``RuleContext.inference``): the step mode and the stepping
    module's parameters (bytes, tensors, dtype); None for training runs and exports."""
    status = ScriptStatus.of(status)
    if not is_inference(status):
        return None
    bare = status.bare_run or ScriptStatus()
    return {"step_mode": status.step_mode, "root_parameters": status.root_parameters or bare.root_parameters}


def _step_times(run: ScriptStatus, ids: list[int]) -> tuple[dict[int, float], str]:
    for key, method in (("step_gpu_ns", "CUDA events at the step boundaries"),
                        ("step_wall_ns", "host wall-clock time between the step boundaries")):
        found = _times(run, ids, key)
        if found:
            return found, method
    return {}, ""


def _generation(run: ScriptStatus, times: dict[int, float], samples: int | None) -> dict | None:
    """Medians over the measured generate() steps of TTFT, TPOT (ns) and tokens/s; None without
    forward offsets (a run that was not in generate mode)."""
    forwards = run.generate_forwards or {}
    gpu = all("gpu_ns" in forwards.get(str(i), {}) for i in times)
    ttft, tpot, rate, tokens = [], [], [], []
    for i, step_ns in times.items():
        entry = forwards.get(str(i))
        offsets = (entry or {}).get("gpu_ns" if gpu else "wall_ns") or []
        if len(offsets) < 2:
            continue
        n = len(offsets)
        ttft.append(offsets[1])
        tpot.append((step_ns - offsets[1]) / (n - 1))
        tokens.append(n * (samples or 1))
        rate.append(tokens[-1] / (step_ns / 1e9))
    if not ttft:
        return None
    return {"ttft_ns": float(np.median(ttft)), "tpot_ns": float(np.median(tpot)),
            "tokens_per_s": float(np.median(rate)), "tokens_per_step": float(np.median(tokens)),
            "tokens_per_s_samples": rate, "sequences_per_step": samples,
            "method": ("CUDA events" if gpu else "host wall-clock time") + " at each forward's start (docs/inference.md)"}


def request_metrics(status: ScriptStatus | dict | None, measured_ids: list[int]) -> dict | None:
    """The per-request section of the report, or None when the run is not an inference run
    (:func:`is_inference`) or has no step time. ``status``: the launcher's status of the profiled
    run (with ``bare_run`` when one was made); ``measured_ids``: the measured steps' indices.

    Returns ``source`` ("bare run" or "profiled run"), ``steps``, ``latency_ns`` {p50, p90, p99},
    ``latency_samples_ns``, ``samples_per_step``, ``samples_per_s`` (samples per step ÷ median
    step time), ``startup_ns`` and ``warmup_ns`` (the run's start-up before step 0, and its warm-up
    steps: in no measured step), ``warmup_steps``, ``method`` and ``generation``
    (see :func:`_generation`) for generate() steps."""
    status = ScriptStatus.of(status)
    if not is_inference(status):
        return None
    bare = status.bare_run
    run, source = (bare, "bare run") if bare and _step_times(bare, measured_ids)[0] else (status, "profiled run")
    times, method = _step_times(run, measured_ids)
    if not times:
        return None
    samples = run.samples_per_step or status.samples_per_step
    values = list(times.values())
    median = float(np.median(values))
    return {
        "source": source, "step_mode": status.step_mode, "steps": len(values), "method": method,
        "latency_ns": {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES},
        "latency_samples_ns": values,
        "samples_per_step": samples,
        "samples_per_s": (samples / (median / 1e9)) if samples and median > 0 else None,
        "startup_ns": run.startup_ns, "warmup_ns": run.warmup_ns, "warmup_steps": run.warmup_steps,
        "generation": _generation(run, times, samples),
    }


def decode_floor(generation: dict, status: ScriptStatus | dict | None, bandwidth: float | None) -> dict | None:
    """The decode step against the memory roofline: the bytes one output token must read (the
    weights, plus the KV cache at the mean context length, prompt + half the new tokens, for each
    sequence: Hugging Face decoder-only configs only) ÷ the HBM bandwidth (bytes/s). Returns
    {"floor_ns", "bytes", "kv_included", "tpot_over_floor"}; None without the weights' size."""
    status = ScriptStatus.of(status) or ScriptStatus()
    bare = status.bare_run or ScriptStatus()
    params = status.root_parameters or bare.root_parameters
    if not params or not params.get("bytes") or not bandwidth:
        return None
    total, kv = float(params["bytes"]), params.get("kv_bytes_per_position")
    shape = status.first_input_shape or bare.first_input_shape
    sequences = generation.get("sequences_per_step") or 1
    new = generation["tokens_per_step"] / sequences
    if kv and shape and len(shape) >= 2:
        total += sequences * (shape[1] + new / 2) * kv
    floor = total / bandwidth * 1e9
    return {"floor_ns": floor, "bytes": total, "kv_included": bool(kv and shape and len(shape) >= 2),
            "tpot_over_floor": generation["tpot_ns"] / floor if floor else None}


def apply_requests(report: dict) -> dict:
    """Adds ``inference`` (:func:`request_metrics`) to ``report`` (whose ``script`` is the
    launcher's status and ``steps.per_step`` the measured steps), with the decode roofline
    (:func:`decode_floor`) for generate() runs; returns the report."""
    ids = [int(s["step"]) for s in (report.get("steps") or {}).get("per_step", []) if s.get("measured")]
    inference = request_metrics(report.get("script"), ids)
    if inference and inference.get("generation"):
        bandwidth = (report.get("device") or {}).get("memory_bandwidth_bytes_per_s")
        inference["generation"]["decode_roofline"] = decode_floor(inference["generation"], report.get("script"),
                                                                  bandwidth)
    report["inference"] = inference
    return report
