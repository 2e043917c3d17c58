"""BERT-base sequence classifier (``BertConfig()``, random weights: nothing is downloaded) trained by
the Hugging Face ``Trainer``, fp32 by default, on a synthetic in-memory dataset of token ids
(sequence 128, batch 32).

    python hf_trainer_bert.py [--gradient-accumulation-steps N] [--max-steps 200]
    python hf_trainer_bert.py --tiny --max-steps 4            # a CPU smoke test

``--max-steps`` counts optimizer steps (the Trainer's ``state.global_step``; with
``--gradient-accumulation-steps N`` each is N batches). A ``fw_step N`` line is printed at each
``on_step_end``. TrainingArguments: ``report_to=[]``, ``save_strategy="no"``, the Trainer's default
optimizer (``adamw_torch_fused`` on torch >= 2.8) and logging (every 500 steps). By-hand changes
(hand.sh): ``--bf16``, ``--tf32``, ``--compile`` (``torch_compile=True``), ``--optim NAME``,
``--workers N``. With FW_STEP_TIMES=1 the per-optimizer-step times are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fwcommon  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)


class TokenIds(Dataset):
    """``length`` samples cycling over ``distinct`` random sequences: input_ids, attention_mask,
    token_type_ids, labels (one epoch covers the whole run, so no epoch ends inside it)."""

    def __init__(self, length: int, seq: int, vocab: int, distinct: int = 4096):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000, vocab, (distinct, seq), generator=g)
        self.ids[:, 0] = 101  # [CLS]
        self.ids[:, -1] = 102  # [SEP]
        self.labels = torch.randint(0, 2, (distinct,), generator=g)
        self.length, self.distinct = length, distinct
        self.mask = torch.ones(seq, dtype=torch.long)
        self.types = torch.zeros(seq, dtype=torch.long)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        k = i % self.distinct
        return {"input_ids": self.ids[k], "attention_mask": self.mask, "token_type_ids": self.types,
                "labels": self.labels[k]}


class PrintSteps(TrainerCallback):
    def __init__(self, args):
        self.args = args

    def on_step_end(self, args, state, control, **kwargs):
        fwcommon.print_step(state.global_step, self.args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--batch-size", type=int, default=None, help="per-device batch (default 32; 4 with --tiny)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 128; 32 with --tiny)")
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True) (by hand)")
    parser.add_argument("--optim", default=None, help="TrainingArguments(optim=...) (default: the Trainer's)")
    parser.add_argument("--workers", type=int, default=0, help="dataloader_num_workers (default 0)")
    parser.add_argument("--output-dir", default=None, help="Trainer output_dir (default: a temporary folder)")
    fwcommon.add_common(parser)
    args = parser.parse_args(argv)
    device = fwcommon.device_of(args)
    fwcommon.apply_backend_flags(args)
    if args.tiny:
        config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            num_labels=2)
    else:
        config = BertConfig(num_labels=2)  # bert-base: 12 layers, hidden 768, vocab 30522
    batch = args.batch_size or (4 if args.tiny else 32)
    seq = args.seq or (32 if args.tiny else 128)
    model = BertForSequenceClassification(config)
    length = batch * args.gradient_accumulation_steps * args.max_steps
    dataset = TokenIds(length, seq, config.vocab_size)
    extra = {}
    if args.optim:
        extra["optim"] = args.optim
    if args.tf32:
        extra["tf32"] = True
    out = args.output_dir or tempfile.mkdtemp(prefix="hf_trainer_bert_")
    training_args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=batch,
        gradient_accumulation_steps=args.gradient_accumulation_steps, max_steps=args.max_steps,
        learning_rate=5e-5, report_to=[], save_strategy="no", bf16=args.bf16, torch_compile=args.compile,
        dataloader_num_workers=args.workers, use_cpu=device.type == "cpu", disable_tqdm=True, seed=0, **extra)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[PrintSteps(args)])
    fwcommon.install_step_clock()
    trainer.train()
    print(f"hf global_step {trainer.state.global_step}", flush=True)
    fwcommon.report_step_clock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
