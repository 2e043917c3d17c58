"""A small Lightning module optimized by ``torch.optim.LBFGS``: Lightning's automatic optimization
hands the optimizer a closure (forward + backward), which LBFGS evaluates several times in one
``optimizer.step(closure)`` (up to ``max_iter`` evaluations a step). It checks gpudiag's steps and
their attribution (one optimizer step holding several forwards and backwards), not speed.

    python lightning_closure_lbfgs.py [--max-steps 200] [--max-iter 4]
    python lightning_closure_lbfgs.py --tiny --max-steps 5     # a CPU smoke test

The model is an MLP (1024 -> 2048 -> 2048 -> 1, GELU) regressing an in-memory random dataset (batch
512). One line per optimizer step: ``fw_step N closures=K`` (K: the closure evaluations LBFGS made
in that step, counted in ``training_step``). With FW_STEP_TIMES=1 the per-step times are printed.
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
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Regressor(L.LightningModule):
    def __init__(self, width: int, hidden: int, max_iter: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))
        self.max_iter = max_iter
        self.closures = 0

    def training_step(self, batch, batch_idx):
        self.closures += 1  # Lightning runs training_step inside the closure LBFGS evaluates
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=self.max_iter, history_size=10)


class PrintSteps(L.Callback):
    def __init__(self, args):
        self.args, self.last, self.closures_before = args, 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.last:
            self.last = trainer.global_step
            fwcommon.print_step(self.last, self.args, f"closures={pl_module.closures - self.closures_before}")
            self.closures_before = pl_module.closures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--max-iter", type=int, default=4, help="LBFGS max_iter: closure evaluations a step (default 4)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 512 (32 with --tiny)")
    fwcommon.add_common(parser)
    args = parser.parse_args(argv)
    device = fwcommon.device_of(args)
    fwcommon.apply_backend_flags(args)
    width, hidden = (32, 64) if args.tiny else (1024, 2048)
    batch = args.batch_size or (32 if args.tiny else 512)
    n = batch * 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    y = x[:, :8].sum(dim=1) + 0.1 * torch.randn(n, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True)
    model = Regressor(width, hidden, args.max_iter)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=args.max_steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[PrintSteps(args)])
    fwcommon.install_step_clock()
    trainer.fit(model, loader)
    print(f"lightning global_step {trainer.global_step}, closure evaluations {model.closures}", flush=True)
    fwcommon.report_step_clock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
