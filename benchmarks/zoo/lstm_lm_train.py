"""2-layer LSTM language model training, bf16 autocast, AdamW (default implementation).

    gpudiag profile benchmarks/zoo/lstm_lm_train.py
    python benchmarks/zoo/lstm_lm_train.py --steps 14 --compile   # the change by hand (zoo_changes.py)

Embedding 10k x 512 -> nn.LSTM(512, 512, 2 layers, cuDNN) -> Linear to 10k, batch 32 x 64 tokens,
cross-entropy on the next token.
"""

import argparse

import torch

import zoo_changes
from zoo_common import StepTimer


class LSTMLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, dim, layers, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo_changes.add_arguments(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    vocab, dim, batch, seq = (500, 32, 2, 16) if args.tiny else (10_000, 512, 32, 64)
    torch.manual_seed(0)
    model = LSTMLM(vocab, dim).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **zoo_changes.optimizer_kwargs(args))
    forward = zoo_changes.model_forward(args, model)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    print(f"lstm_lm_train: batch {batch} x {seq}, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    for _ in range(args.steps):
        zoo_changes.step_begin(args)
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = forward(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        timer.stop()
    print(f"median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
