"""An image classifier trained data-parallel (DDP or FSDP2), bf16 autocast, AdamW: issue 22's
held-out multi-GPU workload (the distributed rules were built on ``ddp_train.py``, not on this).

    torchrun --standalone --nproc-per-node 2 benchmarks/zoo/ddp_vit.py                    # DDP, NCCL
    torchrun --standalone --nproc-per-node 2 benchmarks/zoo/ddp_vit.py --bucket-cap-mb 100
    torchrun --standalone --nproc-per-node 2 benchmarks/zoo/ddp_vit.py --accum 4 [--no-sync]
    gpudiag profile --nproc-per-node 2 benchmarks/zoo/ddp_vit.py -- --fsdp [--no-reshard]

timm ViT-B/16 (86 M parameters, fp32 master weights: 344 MB of gradients), 224x224 random images,
batch 32 per rank. ``--no-sync``: every micro-batch but the last under ``model.no_sync()`` (DDP).
Rank 0 prints ``median_step_ms`` (CUDA events, after ``--warmup`` steps).
"""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist

from zoo_common import StepTimer


def wrap(model, args, device):
    """DDP (``--bucket-cap-mb``), or FSDP2's ``fully_shard`` per transformer block and the model."""
    if not args.fsdp:
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, reshard_after_forward=not args.no_reshard)
    fully_shard(model, reshard_after_forward=not args.no_reshard)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000, help="optimizer steps (gpudiag's window stops it earlier)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--no-reshard", action="store_true", help="FSDP: reshard_after_forward=False")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-sync", action="store_true", help="DDP: no_sync() on all micro-batches but the last")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", action="store_true", help="torch.compile of the wrapped model (by hand)")
    parser.add_argument("--fused-optimizer", action="store_true", help="AdamW(fused=True) (by hand)")
    args = parser.parse_args()

    import timm

    local_rank, world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = args.device == "cuda"
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda and torch.cuda.device_count() >= world else "gloo")
    torch.manual_seed(0)
    model = wrap(timm.create_model(args.model, pretrained=False, num_classes=1000).to(device), args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if args.fused_optimizer else {}))
    if args.compile:  # DDP's documented form: compile the wrapped model
        model = torch.compile(model)
    g = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    images = torch.randn(args.batch, 3, 224, 224, device=device, generator=g)
    labels = torch.randint(0, 1000, (args.batch,), device=device, generator=g)
    timer = StepTimer(device)
    for _ in range(args.steps):
        timer.start()
        for micro in range(args.accum):
            quiet = args.no_sync and not args.fsdp and micro < args.accum - 1
            with model.no_sync() if quiet else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(images), labels) / args.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        timer.stop()
    median = timer.median_ms(skip=args.warmup)
    if dist.get_rank() == 0:
        print(f"ddp_vit: {'FSDP2' if args.fsdp else 'DDP'}, world {world}; median_step_ms {median:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
