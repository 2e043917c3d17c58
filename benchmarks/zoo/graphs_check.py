"""Device check (issue 11): gpudiag's reference kernels and patched HF models under CUDA graphs.

    python benchmarks/zoo/graphs_check.py --json graphs.json

1. Each public fused function of gpudiag.fused.custom_ops, forward and backward, captured with
   ``torch.cuda.make_graphed_callables`` and replayed on new inputs, against the same function run
   eagerly on those inputs (the oracle: eager PyTorch of the same kernels). Dropout cannot be
   compared element-wise with another draw: for it the check is that two replays on the same input
   draw different masks (a seed fixed at capture would repeat one mask on every replay) and that
   the kept share is about 1 - p.
2. A tiny Llama (``hf.apply(fuse_lm_loss=True)``) and a tiny GPT-2 with dropout, their training
   forward + backward captured whole with ``torch.cuda.graph``, against eager runs of the unpatched
   model (loss and gradient norm).
3. ``torch.compile(mode="reduce-overhead")`` (Inductor's CUDA graph trees) over the Llama:
   unpatched, patched with ``under_compile="hf"`` (the default: HF's code is compiled) and with
   ``under_compile="kernels"`` (the custom ops in the graph); Inductor's cudagraph counters, graph
   breaks and the loss against eager.

Prints one JSON line per check; ``--json`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import traceback

import torch

from gpudiag.fused import custom_ops as ops

DEV = torch.device("cuda")


def _rand(*shape, dtype=torch.bfloat16, grad=True):
    return torch.randn(*shape, device=DEV, dtype=dtype).requires_grad_(grad)


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def _outputs(fn, inputs):
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward([o for o in out if o.requires_grad],
                            [torch.ones_like(o) for o in out if o.requires_grad])
    grads = [t.grad.clone() for t in inputs if t.requires_grad]
    for t in inputs:
        t.grad = None
    return [o.detach().clone() for o in out], grads


FUNCTIONS = {  # name -> (function of tensors only, input factory)
    "rms_norm": (lambda x, w: ops.rms_norm(x, w), lambda: (_rand(4, 128, 512), _rand(512))),
    "swiglu": (ops.swiglu, lambda: (_rand(4, 128, 1024), _rand(4, 128, 1024))),
    "bias_gelu": (ops.bias_gelu, lambda: (_rand(4, 128, 1024), _rand(1024))),
    "add_layer_norm": (lambda x, r, w, b: ops.add_layer_norm(x, r, w, b, 1e-5)[0],
                       lambda: (_rand(4, 128, 512), _rand(4, 128, 512), _rand(512), _rand(512))),
    "rope": (ops.rope, lambda: (_rand(2, 8, 128, 64), _rand(2, 4, 128, 64), _rand(1, 128, 64, grad=False),
                                _rand(1, 128, 64, grad=False))),
    "linear_cross_entropy": (ops.linear_cross_entropy,
                             lambda: (_rand(512, 256), _rand(1000, 256),
                                      torch.randint(0, 1000, (512,), device=DEV))),
}


def check_function(name: str) -> dict:
    """FUNCTIONS[name] graphed (forward + backward) against eager on the same new inputs: the
    largest relative error over outputs and input gradients."""
    fn, make = FUNCTIONS[name]
    graphed = torch.cuda.make_graphed_callables(fn, make())
    inputs = make()
    got, got_grads = _outputs(graphed, inputs)
    want, want_grads = _outputs(fn, inputs)
    errors = [_max_rel(g, w) for g, w in zip(got + got_grads, want + want_grads)]
    return {"check": f"graphed {name}", "max_rel_error": max(errors), "ok": max(errors) < 2e-2}


def check_dropout() -> dict:
    """Graphed bias_dropout_add (p = 0.1) replayed twice on one input: the masks must differ and
    keep about 1 - p of the elements."""
    p = 0.1
    x, r = _rand(8, 128, 512), _rand(8, 128, 512)
    graphed = torch.cuda.make_graphed_callables(lambda a, b: ops.bias_dropout_add(a, b, None, p=p), (x, r))
    x2 = torch.ones(8, 128, 512, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    r2 = torch.zeros_like(x2, requires_grad=True)
    first = graphed(x2, r2).detach().clone()
    second = graphed(x2, r2).detach().clone()
    kept = float((first != 0).float().mean())
    same = bool(torch.equal(first, second))
    return {"check": "graphed bias_dropout_add p=0.1", "replays_draw_the_same_mask": same, "kept_share": kept,
            "ok": (not same) and abs(kept - (1 - p)) < 0.01}


def _llama(patched: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(DEV).train()
    if patched:
        from gpudiag.fused import hf

        hf.apply(model, fuse_lm_loss=True)
    return model


def _gpt2(patched: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=2048, n_embd=256, n_layer=2, n_head=4, n_positions=256, attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).to(DEV).train()  # dropout 0.1 everywhere (GPT-2's default)
    if patched:
        from gpudiag.fused import hf

        hf.apply(model)
    return model


def _step(model, ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def _grad_norm(model) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in model.parameters()
                                                       if p.grad is not None])))


def _captured_step(model, ids):
    """A training forward + backward captured whole; returns (replay, static loss)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the capture (Triton compiles, autotunes, allocates)
            model.zero_grad(set_to_none=True)
            _step(model, ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=False)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    with torch.cuda.graph(graph):
        loss = _step(model, ids)
    return graph, loss


def check_model(name: str, build) -> dict:
    """A patched tiny model's training step captured whole and replayed twice, against one eager
    step of the unpatched model (loss, gradient norm)."""
    ids = torch.randint(0, 2048, (4, 128), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    reference = build(False)
    ref_loss = float(_step(reference, ids))
    ref_norm = _grad_norm(reference)
    model = build(True)
    graph, loss = _captured_step(model, ids)
    losses = []
    for _ in range(2):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        losses.append(float(loss.detach()))
    result = {"check": f"captured training step, {name}", "eager_unpatched_loss": ref_loss, "replay_losses": losses,
              "eager_unpatched_grad_norm": ref_norm, "replay_grad_norm": _grad_norm(model)}
    result["loss_rel_error"] = abs(losses[-1] - ref_loss) / abs(ref_loss)
    dropout = name == "gpt2"  # with dropout, replays must differ from each other and only roughly match eager
    result["ok"] = result["loss_rel_error"] < (0.05 if dropout else 0.01) and (losses[0] != losses[1] if dropout else True)
    return result


def check_reduce_overhead(variant: str) -> dict:
    """``variant``: "unpatched", or hf.apply's ``under_compile`` ("hf" or "kernels")."""
    from torch._dynamo.utils import counters

    from gpudiag.fused import hf

    torch._dynamo.reset()
    ids = torch.randint(0, 2048, (4, 128), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    reference = _llama(False)
    ref_loss = float(_step(reference, ids))
    model = _llama(False)
    if variant != "unpatched":
        hf.apply(model, fuse_lm_loss=True, under_compile=variant)
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead")
    losses = []
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()  # a training loop under reduce-overhead marks each step
        losses.append(float(_step(compiled, ids).detach()))
    skips = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    return {"check": f"torch.compile reduce-overhead, llama {variant}", "losses": losses,
            "graph_breaks": sum(counters["graph_break"].values()),
            "eager_unpatched_loss": ref_loss, "inductor_cudagraph_counters": skips,
            "loss_rel_error": abs(losses[-1] - ref_loss) / abs(ref_loss),
            "ok": abs(losses[-1] - ref_loss) / abs(ref_loss) < 0.01 and not skips.get("cudagraph_skips")}


def _relative(text: str) -> str:
    """``text`` with this machine's paths cut to the repository or site-packages (results are committed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
    return re.sub(r"[^\s\"']*site-packages/", "site-packages/", text.replace(root, ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", help="run the checks whose name contains this")
    args = parser.parse_args()
    checks = [(f"graphed {n}", lambda n=n: check_function(n)) for n in FUNCTIONS] + [
        ("graphed bias_dropout_add", check_dropout), ("llama", lambda: check_model("llama", _llama)),
        ("gpt2", lambda: check_model("gpt2", _gpt2)), ] + [
        (f"reduce-overhead {v}", lambda v=v: check_reduce_overhead(v)) for v in ("unpatched", "hf", "kernels")]
    results = []
    for name, check in [c for c in checks if not args.only or args.only in c[0]]:
        try:
            result = check()
        except Exception as exc:  # a failed capture is a result of this check, not the end of the others
            result = {"check": name, "ok": False, "error": _relative(repr(exc))[:500],
                      "traceback": _relative(traceback.format_exc())[-2000:]}
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
