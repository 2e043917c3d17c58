"""Swin-T training on random data: the workload gpudiag's examples were captured from.

    gpudiag profile examples/swin_train.py -- --amp bf16 --steps 10
    python examples/swin_train.py --steps 30 --time [--fused] [--compile]   # step time, CUDA events

timm ``swin_tiny_patch4_window7_224``, random init, batch 32, AdamW, cross-entropy on random labels.
``--fused`` applies the reference kernels gpudiag recommends for it (gpudiag.fused.timm_swin);
``--compile`` runs torch.compile on the model (alone, or over the fused kernels), for comparison;
with both, the patched blocks run timm's code under compile unless ``--fused-under-compile kernels``.
"""

import argparse

import timm
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-at", type=int, default=None, help="raise at this step (shows crash handling)")
    parser.add_argument("--fused", action="store_true", help="apply gpudiag's reference kernels (gpudiag.fused.timm_swin)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--fused-under-compile", choices=["timm", "kernels"], default="timm",
                        help="with --fused --compile: what the patched blocks run under torch.compile "
                             "(timm's code, the default, or gpudiag's custom ops; see timm_swin.plan)")
    parser.add_argument("--time", action="store_true", help="print the median step time (CUDA events, after 5 warm-up steps)")
    args = parser.parse_args()
    if args.time and args.steps <= 5:
        parser.error("--time needs more than 5 steps (the first 5 are warm-up), e.g. --steps 30")

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    if args.fused:
        # The loss stays eager: at [32, 1000] logits the fused cross-entropy is launch-bound and
        # slower (docs/kernels_benchmark.md), and gpudiag does not recommend it here.
        from gpudiag.fused import timm_swin

        timm_swin.apply(model, under_compile=args.fused_under_compile)
        if args.compile:
            first = next(iter(timm_swin.plan(model).values()))
            print(f"--fused under --compile: blocks run {first['compiled']}")
    forward = torch.compile(model) if args.compile else model
    images = torch.randn(args.batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (args.batch,), device="cuda")
    times, losses = [], []
    for step in range(args.steps):
        if step == args.fail_at:
            raise RuntimeError(f"planted failure at step {step}")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = loss_fn(forward(images), labels)
        loss.backward()
        optimizer.step()
        end.record()
        if args.time:
            end.synchronize()
            losses.append(loss.item())
            if step >= 5:
                times.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    if args.time:
        times.sort()
        print(f"median step time {times[len(times) // 2]:.3f} ms over {len(times)} steps (fused={args.fused}, "
              f"compile={args.compile}, under_compile={args.fused_under_compile}); "
              f"losses of the first 3 steps {[round(v, 4) for v in losses[:3]]}")


if __name__ == "__main__":
    main()
