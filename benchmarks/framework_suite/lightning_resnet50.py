"""torchvision ResNet-50 trained by a Lightning ``Trainer`` (automatic optimization), fp32, SGD with
momentum, on an in-memory ``TensorDataset`` of random 224x224 images (batch 64).

    python lightning_resnet50.py [--accumulate-grad-batches N] [--max-steps 200]
    python lightning_resnet50.py --tiny --max-steps 6          # a CPU smoke test

``--max-steps`` counts optimizer steps (Lightning's ``trainer.global_step``); with
``--accumulate-grad-batches N`` each is N batches. A ``fw_step N`` line is printed each time
``global_step`` advances. By-hand changes (hand.sh): ``--precision bf16-mixed``, ``--channels-last``,
``--tf32``, ``--compile``, ``--fused-optimizer``, ``--cudnn-benchmark``. With FW_STEP_TIMES=1 the
per-optimizer-step times are printed at the end (fwcommon.py).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fwcommon  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class ResNetModule(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.model = torchvision.models.resnet50(num_classes=1000)
        self.channels_last = args.channels_last
        self.fused = args.fused_optimizer
        if args.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        if args.compile:
            self.model = torch.compile(self.model)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                               **({"fused": True} if self.fused else {}))


class PrintSteps(L.Callback):
    """'fw_step N' whenever Lightning's optimizer-step counter advances."""

    def __init__(self, args):
        self.args, self.last = args, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.last:
            self.last = trainer.global_step
            fwcommon.print_step(self.last, self.args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accumulate-grad-batches", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64 (8 with --tiny)")
    parser.add_argument("--num-samples", type=int, default=None,
                        help="images in the in-memory dataset (default 2560: 40 batches an epoch; 64 with --tiny)")
    parser.add_argument("--precision", default="32", help="Lightning precision: 32 (default), bf16-mixed, 16-mixed")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    parser.add_argument("--pin-memory", action="store_true",
                        help="DataLoader(pin_memory=True, persistent_workers=True where workers > 0): the "
                             "loader-workers trial's change, by hand (Lightning moves pinned batches non_blocking)")
    fwcommon.add_common(parser)
    args = parser.parse_args(argv)
    device = fwcommon.device_of(args)
    fwcommon.apply_backend_flags(args)
    size = 64 if args.tiny else 224
    batch = args.batch_size or (8 if args.tiny else 64)
    n = args.num_samples or (64 if args.tiny else 40 * 64)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, size, size, generator=g)
    labels = torch.randint(0, 1000, (n,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch, shuffle=True, drop_last=True,
                        num_workers=args.workers, pin_memory=args.pin_memory,
                        persistent_workers=args.pin_memory and args.workers > 0)
    model = ResNetModule(args)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                        precision=args.precision, max_steps=args.max_steps,
                        accumulate_grad_batches=args.accumulate_grad_batches,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, benchmark=args.cudnn_benchmark or None,
                        callbacks=[PrintSteps(args)])
    fwcommon.install_step_clock()
    trainer.fit(model, loader)
    print(f"lightning global_step {trainer.global_step}", flush=True)
    fwcommon.report_step_clock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
