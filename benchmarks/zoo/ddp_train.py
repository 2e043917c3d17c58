"""A GPT-2-style language model trained data-parallel (DDP or FSDP2), bf16 autocast, AdamW.

    torchrun --standalone --nproc-per-node 2 benchmarks/zoo/ddp_train.py            # DDP, gloo
    gpudiag profile --nproc-per-node 2 benchmarks/zoo/ddp_train.py -- --fsdp         # FSDP2 under gpudiag
    torchrun --standalone --nproc-per-node 2 benchmarks/zoo/ddp_train.py --straggle-rank 1 --straggle-ms 20

Several ranks on one GPU need the gloo backend (NCCL refuses two ranks on one device), the default
here when the ranks outnumber the GPUs. Built for issue 22 (multi-process jobs) and not used to
tune any rule: transformers' GPT2LMHeadModel (6 layers, hidden 512, vocabulary 8192, 256 tokens,
batch 8 per rank), random tokens seeded per rank.

``--straggle-rank R --straggle-ms MS``: rank R sleeps MS ms in its data step (the input pipeline
of one rank is slow); ``--accum N``: N micro-batches per optimizer step, all of them all-reducing
unless ``--no-sync``; rank 0 prints ``median_step_ms`` (CUDA events, after ``--warmup`` steps).
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist

from zoo_common import StepTimer


def build_model(tiny: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    size = dict(n_layer=2, n_embd=64, n_head=2) if tiny else dict(n_layer=6, n_embd=512, n_head=8)
    config = GPT2Config(vocab_size=8192, n_positions=256, **size)
    config.attn_implementation = "sdpa"
    return GPT2LMHeadModel(config)


def wrap(model, args, device):
    """DDP (``--bucket-cap-mb``) or FSDP2's ``fully_shard`` per block, then the whole model."""
    if not args.fsdp:
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block, reshard_after_forward=not args.no_reshard)
    fully_shard(model, reshard_after_forward=not args.no_reshard)
    return model


def batches(args, rank: int, device):
    """Random token batches, seeded per rank; the straggler's data step sleeps first."""
    g = torch.Generator().manual_seed(1234 + rank)
    seq = 32 if args.tiny else 256
    while True:
        if rank == args.straggle_rank:
            time.sleep(args.straggle_ms / 1e3)
        yield torch.randint(0, 8192, (args.batch, seq), generator=g).to(device, non_blocking=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000, help="optimizer steps (gpudiag's window stops it earlier)")
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of median_step_ms")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) in place of DDP")
    parser.add_argument("--no-reshard", action="store_true", help="FSDP: reshard_after_forward=False")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--no-sync", action="store_true", help="DDP: no_sync() on all micro-batches but the last")
    parser.add_argument("--straggle-rank", type=int, default=-1)
    parser.add_argument("--straggle-ms", type=float, default=20.0)
    parser.add_argument("--backend", default=None, help="default: nccl with a GPU per rank, else gloo")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a model that runs in seconds on a CPU")
    args = parser.parse_args()

    local_rank, world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = args.device == "cuda"
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda and torch.cuda.device_count() >= world else "gloo")
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = wrap(build_model(args.tiny).to(device), args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = batches(args, rank, device)
    timer = StepTimer(device)
    for _ in range(args.steps):
        timer.start()
        for micro in range(args.accum):
            tokens = next(data)
            quiet = args.no_sync and not args.fsdp and micro < args.accum - 1
            with model.no_sync() if quiet else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = model(input_ids=tokens, labels=tokens).loss / args.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        timer.stop()
    median = timer.median_ms(skip=args.warmup)
    if rank == 0:
        print(f"ddp_train: {backend}, {'FSDP2' if args.fsdp else 'DDP'}, world {world}; median_step_ms {median:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
