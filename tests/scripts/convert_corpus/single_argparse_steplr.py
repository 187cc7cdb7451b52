"""Train a small MLP classifier on synthetic data (one device, argparse, Adam + StepLR)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(384, 8, generator=gen)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])


def evaluate(model, loader):
    """Accuracy on a loader."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for xb, yb in loader:
            correct += (model(xb).argmax(1) == yb).sum().item()
            total += len(yb)
    return correct / total


def main():
    parser = argparse.ArgumentParser(description="MLP on synthetic data")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    train_set, val_set = make_data()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=128)

    # a narrow network: room for dendrites to help
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)

    for epoch in range(args.epochs):
        model.train()
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
        scheduler.step()
        val_acc = evaluate(model, val_loader)
        print(f"epoch {epoch}: val_acc={val_acc:.3f}")  # one line per epoch

    print("done")


if __name__ == "__main__":
    main()
