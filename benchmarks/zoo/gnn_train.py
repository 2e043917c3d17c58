"""GNN training with hand-written message passing (gather -> mul -> index_add), fp32, Adam.

    gpudiag profile benchmarks/zoo/gnn_train.py            # stops after its step window
    python benchmarks/zoo/gnn_train.py --steps 14 --compile # the same change by hand (zoo_changes.py)

Random graph of 100k nodes and 1M edges (seeded), 64 input features, 3 layers of hidden 128:
per layer h' = relu(W_self h + W_msg * sum_{edges j->i} w_ij h_j), node classification into 16
classes with cross-entropy. Plain PyTorch (no torch-geometric): the gathers and scatters are
aten index_select / index_add, what GNN libraries call under the hood.
"""

import argparse

import torch

import zoo_changes
from zoo_common import StepTimer


class MessagePassing(torch.nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.self_lin = torch.nn.Linear(dim_in, dim_out)
        self.msg_lin = torch.nn.Linear(dim_in, dim_out, bias=False)

    def forward(self, h, src, dst, weight):
        messages = self.msg_lin(h).index_select(0, src) * weight.unsqueeze(1)
        aggregated = torch.zeros(h.shape[0], messages.shape[1], device=h.device, dtype=messages.dtype)
        aggregated = aggregated.index_add(0, dst, messages)
        return torch.relu(self.self_lin(h) + aggregated)


class GNN(torch.nn.Module):
    def __init__(self, dim_in: int, hidden: int, classes: int, layers: int = 3):
        super().__init__()
        dims = [dim_in] + [hidden] * layers
        self.layers = torch.nn.ModuleList(MessagePassing(a, b) for a, b in zip(dims, dims[1:]))
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x, src, dst, weight):
        for layer in self.layers:
            x = layer(x, src, dst, weight)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo_changes.add_arguments(parser)
    args = parser.parse_args()
    nodes, edges = (1000, 5000) if args.tiny else (100_000, 1_000_000)
    device = torch.device(args.device)
    zoo_changes.before_model(args)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, 64, generator=g).to(device)
    src, dst = (torch.randint(0, nodes, (edges,), generator=g).to(device) for _ in range(2))
    weight = torch.rand(edges, generator=g).to(device)
    labels = torch.randint(0, 16, (nodes,), generator=g).to(device)
    torch.manual_seed(0)
    model = GNN(64, 128, 16).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **zoo_changes.optimizer_kwargs(args))
    forward = zoo_changes.model_forward(args, model)
    print(f"gnn_train: {nodes} nodes, {edges} edges, {zoo_changes.describe(args)}", flush=True)
    timer = StepTimer(device)
    for _ in range(args.steps):
        zoo_changes.step_begin(args)
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(x, src, dst, weight), labels)
        loss.backward()
        optimizer.step()
        timer.stop()
    print(f"median_step_ms {timer.median_ms(skip=args.warmup):.3f}")


if __name__ == "__main__":
    main()
