"""Module-level train/validate helpers, argparse in get_args(), zero_grad() after step()."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden=6):
        super().__init__()
        self.fc1 = nn.Linear(16, hidden)
        self.fc2 = nn.Linear(hidden, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def get_args():
    parser = argparse.ArgumentParser(description="two-layer net")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=6)
    return parser.parse_args()


def train(model, loader, optimizer):
    model.train()
    for data, target in loader:
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def validate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            correct += (model(data).argmax(1) == target).sum().item()
    return correct / sum(len(t) for _, t in loader)


def main():
    args = get_args()
    torch.set_num_threads(1)
    torch.manual_seed(4)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(420, 16, generator=gen)
    y = (x[:, :8] @ torch.randn(8, 5, generator=gen)).argmax(1)
    train_loader = [(x[i:i + 60], y[i:i + 60]) for i in range(0, 300, 60)]
    val_loader = [(x[300:], y[300:])]

    model = Net(args.hidden)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[10, 20], gamma=0.3)

    best = 0.0
    for epoch in range(1, args.epochs + 1):
        train(model, train_loader, optimizer)
        val_score = validate(model, val_loader)
        scheduler.step()
        if val_score > best:
            best = val_score
        print(f"epoch {epoch} val {val_score:.3f} best {best:.3f}")


if __name__ == "__main__":
    main()
