"""The host rules' wording (``analysis/rules/host.py``), as a user reads it in the report: title,
how the saving was estimated, evidence and advice of every host rule that fires on five real
captures, with every number written as "#" (test_host_rules.py checks the numbers against SQL and
the rules' inputs). Issue 35 part 6: changed advice and evidence texts survived earlier mutation
draws, since the other tests read them by phrase."""

from __future__ import annotations

import dataclasses
import re

import pytest
from test_host_rules import context  # noqa: F401  (the fixture: capture name -> run database, RuleContext)

from gpudiag.analysis.rules import host

# The host rules' wording (issue 35 part 6: text survivors of fresh mutation draws), as a user reads
# it in the report: title, how the saving was estimated, evidence and advice, with every number
# written as "#".
TITLE = {
    "GD-HOST-COMPUTE": "The GPU waits while the host runs CPU work",
    "GD-HOST-SYNC": "The step synchronizes the host with the GPU",
    "GD-INPUT-STALL": "The GPU waits for input data at the start of each step",
    "GD-OVERHEAD-BOUND": "The GPU waits for the host to launch kernels",
    "GD-PAGEABLE-COPY": "Copies use pageable host memory",
    "GD-UNFUSED-OPTIMIZER": "The optimizer is not fused"}
ADVICE = {
    "GD-HOST-COMPUTE": "Overlap the CPU work with the GPU's: make inputs on the GPU (`torch.randn(..., device=\"cuda\")`, "
                       "GPU-side preprocessing), move per-sample or per-request CPU work (decoding, augmentation, "
                       "tokenizing, post-processing of `.tolist()` results) to DataLoader workers (`num_workers=N`) or a "
                       "background thread that prepares the next batch while the GPU runs this one, and copy from "
                       "pinned memory with `non_blocking=True`. CUDA graphs and torch.compile do not remove this time.",
    "GD-HOST-SYNC": "Remove per-step `.item()`, `.cpu()`, `print(tensor)` and `torch.cuda.synchronize()`; accumulate "
                    "metrics on the GPU and read them every N steps; copy to the host with `non_blocking=True` into "
                    "pinned memory.",
    "GD-INPUT-STALL": "Load and augment data in worker processes (`DataLoader(num_workers=N, persistent_workers=True, "
                      "prefetch_factor=2)`), pin memory, and move per-sample work off the training loop's thread.",
    "GD-OVERHEAD-BOUND": "Capture the step in a CUDA Graph (`torch.cuda.graphs`, or `torch.compile(model, "
                         "mode=\"reduce-overhead\")`), fuse small ops (`torch.compile`), or raise the batch size so each "
                         "kernel does more work.",
    "GD-PAGEABLE-COPY": "Allocate host batches in pinned memory (`DataLoader(pin_memory=True)`, `tensor.pin_memory()`) "
                        "and copy with `.to('cuda', non_blocking=True)`.",
    "GD-UNFUSED-OPTIMIZER": "Use the fused implementation: `torch.optim.AdamW(params, fused=True)` (also Adam, SGD)."}
_LAUNCH = ["# ms/step of GPU idle with an empty launch queue while the host issued work (# % of the step), # gaps/step",
           "# kernel launches/step, # of them overhead-bound"]
_LOOP = ("launch-bound GPU idle time between kernels per step, at most the step less what CUDA graphs of the model "
         "leave: the loop's own host time outside the forwards plus the kernels",
         [*_LAUNCH, "# forward calls per step with # ms/step of host time outside them (the loop's own: CUDA graphs of "
                    "the model keep it) and # ms/step of kernels"])
_STALL = ("mean host-bound GPU idle before each step's first kernel",
          ["# ms of GPU idle before each step's first kernel (mean over # steps, median # ms; # % of the step)"])
_FOREACH = ["# optimizer kernels/step, # ms/step of GPU time",
            "multi_tensor_apply_kernel · TensorListMetadata: # µs/step (# launches)",
            "multi_tensor_apply_kernel · TensorListScalarListMetadata: # µs/step (# launches)"]
_ONE_PASS = "optimizer GPU time minus one fused pass (# x # bytes x # M parameters at peak bandwidth)"
_HOST_BOUND = ("host-bound step: the optimizer step's host time ({}), less one fused launch (# ms/step); by GPU time "
               f"alone: {_ONE_PASS}, # ms")
WORDING = {
    "input_pipeline_bad": {
        "GD-HOST-COMPUTE": ("GPU idle per step while the launching thread ran CPU work with no CUDA call for over # ms: "
                            "overlapping that work with the GPU's removes it",
                            ["# ms/step of GPU idle with an empty launch queue while the launching thread ran CPU work "
                             "(# % of the step), # ms/step of it before the step's first kernel",
                             "# stretches/step with no CUDA call for over # ms; the longest left the GPU idle # ms (step "
                             "#), between `cudaStreamSynchronize` and `cudaStreamIsCapturing`",
                             "where (innermost NVTX range on the launching thread): outside every range # ms/step"]),
        "GD-HOST-SYNC": ("host-bound GPU idle that begins during a sync (not counting idle before the step's first kernel)",
                         ["# synchronizing calls/step blocking the host # ms/step: cudaStreamSynchronize x#",
                          "# device-to-host copies/step (# bytes/step)"]),
        "GD-PAGEABLE-COPY": ("pageable copy time per step", ["# pageable copies/step, # MB/step, # ms/step (# GB/s)"]),
        "GD-INPUT-STALL": _STALL,
        "GD-UNFUSED-OPTIMIZER": ("optimizer GPU time per step (parameter count not recorded)",
                                 ["# optimizer kernels/step, # ms/step of GPU time",
                                  "vectorized_elementwise_kernel · AUnaryFunctor · fp#: # µs/step (# launches)",
                                  "vectorized_elementwise_kernel · addcdiv_cuda_kernel · fp#: # µs/step (# launches)"])},
    "towers_inference": {"GD-OVERHEAD-BOUND": _LOOP, "GD-INPUT-STALL": _STALL},
    "mlp_decode": {"GD-OVERHEAD-BOUND": _LOOP},
    "swin_t_train_bf16": {
        "GD-OVERHEAD-BOUND": ("launch-bound GPU idle time between kernels per step (removed if launches were free)", _LAUNCH),
        "GD-UNFUSED-OPTIMIZER": (_HOST_BOUND.format("as traced (no bare run: an upper bound)"), _FOREACH)},
    "gpt2_train_bf16": {"GD-UNFUSED-OPTIMIZER": (_ONE_PASS, _FOREACH)},
}
HOST_RULES = (host.overhead_bound, host.host_compute, host.host_syncs, host.pageable_copies, host.input_stall,
              host.unfused_optimizer)


def _worded(rec) -> tuple:
    """A recommendation's texts, with every number of its estimate and evidence written as "#"."""
    def mask(text: str) -> str:
        return re.sub(r"\d+(?:\.\d+)?", "#", text)

    return rec.rule_id, rec.title, mask(rec.estimate), [mask(e) for e in rec.evidence], rec.how_to_fix


@pytest.mark.parametrize("name", sorted(WORDING))
def test_the_host_rules_say_what_they_found_in_their_wording(context, name):
    """Every host rule that fires on a real capture, and only those, in the order the rules run
    (WORDING lists them so), with its title, estimate, evidence and advice worded as the report
    shows them."""
    _, ctx = context(name)
    fired = [_worded(rec) for rec in (rule(ctx) for rule in HOST_RULES) if rec is not None]
    assert fired == [(rule, TITLE[rule], est, ev, ADVICE[rule]) for rule, (est, ev) in WORDING[name].items()]


def test_the_optimizers_host_saving_says_it_was_scaled_to_the_bare_run(context):
    """With a bare run (the profiler's inflation known, here 0 ns) the unfused optimizer's host-bound
    saving is said to be scaled to the run without the profiler, not an upper bound as traced."""
    _, ctx = context("swin_t_train_bf16")
    rec = host.unfused_optimizer(dataclasses.replace(ctx, bare_inflation_ns=0.0))
    assert _worded(rec)[2] == _HOST_BOUND.format("scaled to the run without the profiler")
    assert _worded(rec)[3] == _FOREACH
