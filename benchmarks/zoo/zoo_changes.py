"""The changes gpudiag's trials apply, made by hand in a zoo script (the trials' oracle): each flag
is the usual one-line edit a user would make. Used by the trial-proof workloads
(docs/trials_proof.md); ``--warmup`` / ``--steps`` give the same window as a trial (4 + 10 steps)."""

from __future__ import annotations

import argparse

import torch

FLAGS = {  # gpudiag --try change -> this script's flag
    "compile": "--compile", "compile-graphs": "--compile-graphs", "fused-optimizer": "--fused-optimizer",
    "channels-last": "--channels-last", "tf32": "--tf32", "bf16-autocast": "--bf16-autocast",
    "cudnn-benchmark": "--cudnn-benchmark", "half-weights": "--half-weights", "static-cache": "--static-cache",
    "static-cache-compile": "--static-cache-compile",
}


def add_arguments(parser: argparse.ArgumentParser, steps: int = 10000) -> None:
    parser.add_argument("--steps", type=int, default=steps, help="training steps (gpudiag's window stops it earlier)")
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of median_step_ms")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a model that runs in seconds on a CPU")
    for flag in FLAGS.values():
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--autocast-form", choices=("call", "forward"), default="call",
                        help="--bf16-autocast around the model call (default) or as model.forward (gpudiag's trial form)")


def before_model(args) -> None:
    """Process-wide switches, set before the model is built."""
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True


def model_forward(args, model: torch.nn.Module):
    """The model as the loop should call it: channels_last, compiled, autocast as asked."""
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward = model
    if args.compile:
        forward = torch.compile(model)
    elif args.compile_graphs:
        forward = torch.compile(model, mode="reduce-overhead")
    if args.bf16_autocast and args.autocast_form == "forward":
        model.forward = torch.autocast("cuda", dtype=torch.bfloat16)(model.forward)
    elif args.bf16_autocast:
        inner = forward

        def forward(*a, **k):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return inner(*a, **k)
    return forward


def inputs(args, x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if args.channels_last and x.dim() == 4 else x


def optimizer_kwargs(args) -> dict:
    return {"fused": True} if args.fused_optimizer else {}


def step_begin(args) -> None:
    """What torch asks of a training loop under reduce-overhead CUDA graphs."""
    if args.compile_graphs:
        torch.compiler.cudagraph_mark_step_begin()


def describe(args) -> str:
    return " ".join(f for c, f in FLAGS.items() if getattr(args, f[2:].replace("-", "_"))) or "baseline"
