"""GraphSAGE node classification with torch_geometric, full-batch, fp32, Adam.

    python benchmarks/zoo34/gnn_sage.py                    # runs until stopped; --steps N to stop
    python benchmarks/zoo34/gnn_sage.py --hand compile     # the hand change: model = torch.compile(model)
    gpudiag profile benchmarks/zoo34/gnn_sage.py

A random graph (seeded): 100k nodes, 1.5M directed edges (``edge_index`` of shape 2 x E, as
torch_geometric's datasets give it), 128 input features, 40 classes (ogbn-arxiv-like sizes), half
of the nodes in the training mask. Three ``SAGEConv`` layers (mean aggregation, hidden 256) with
ReLU and dropout 0.5; every step runs the whole graph. Unlike benchmarks/zoo/gnn_train.py (plain
PyTorch gathers), the message passing is torch_geometric's own (``propagate``, scatter-mean).
"""

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

import steptime


class SAGE(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, layers: int = 3, dropout: float = 0.5):
        super().__init__()
        dims = [features] + [hidden] * (layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
        self.dropout = dropout

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steptime.add_arguments(parser, hands=("compile",))
    parser.add_argument("--nodes", type=int, default=None, help="default 100000 (2000 with --tiny)")
    parser.add_argument("--edges", type=int, default=None, help="default 1500000 (20000 with --tiny)")
    args = parser.parse_args()
    device = steptime.device_of(args)
    nodes = args.nodes or (2000 if args.tiny else 100_000)
    edges = args.edges or (20_000 if args.tiny else 1_500_000)
    features, hidden, classes = (32, 64, 8) if args.tiny else (128, 256, 40)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, features, generator=g).to(device)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g).to(device)
    y = torch.randint(0, classes, (nodes,), generator=g).to(device)
    train_mask = (torch.rand(nodes, generator=g) < 0.5).to(device)
    torch.manual_seed(0)
    model = SAGE(features, hidden, classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    if "compile" in args.hand:
        model = torch.compile(model)
    print(f"gnn_sage: {nodes} nodes, {edges} edges, SAGEConv x3 hidden {hidden}, device {device}, "
          f"hand: {','.join(args.hand) or 'none'}", flush=True)
    model.train()
    clock = steptime.StepClock(device, args.warmup, args.log_every)
    try:
        while args.steps is None or clock.steps < args.steps:
            optimizer.zero_grad(set_to_none=True)
            out = model(x, edge_index)
            loss = F.cross_entropy(out[train_mask], y[train_mask])
            loss.backward()
            optimizer.step()
            clock.tick()
    finally:
        clock.report()


if __name__ == "__main__":
    main()
