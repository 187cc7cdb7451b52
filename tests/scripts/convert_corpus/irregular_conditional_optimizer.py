"""The optimizer is chosen on the command line (built conditionally)."""
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["sgd", "adam"], default="adam")
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(200, 4)
y = (x.sum(1) > 0).long()
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
if args.optim == "sgd":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
else:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for epoch in range(args.epochs):
    for i in range(0, 160, 32):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
        optimizer.step()
    with torch.no_grad():
        val_acc = (model(x[160:]).argmax(1) == y[160:]).float().mean().item()
    print(epoch, val_acc)
