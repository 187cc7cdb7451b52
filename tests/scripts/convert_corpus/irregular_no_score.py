"""A per-batch OneCycleLR and a test() that only prints: nothing to report once per epoch."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


def train(args, model, loader, optimizer, scheduler, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if batch_idx % args.log_interval == 0:
            print(f"epoch {epoch} batch {batch_idx} loss {loss.item():.4f}")


def test(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            correct += (model(data).argmax(1) == target).sum().item()
    print(f"test accuracy {correct / sum(len(t) for _, t in loader):.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--log-interval", type=int, default=2)
    args = parser.parse_args()
    x = torch.randn(256, 8)
    y = (x.sum(1) > 0).long()
    loader = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 192, 32)]
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2,
                                                    total_steps=args.epochs * len(loader))
    for epoch in range(1, args.epochs + 1):
        train(args, model, loader, optimizer, scheduler, epoch)
        test(model, [(x[192:], y[192:])])


if __name__ == "__main__":
    main()
