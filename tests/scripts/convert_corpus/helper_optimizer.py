"""Optimizer and scheduler built in a helper function (AdamW + CosineAnnealingLR)."""
import argparse

import torch
from torch import nn
from torch.optim import AdamW
from torch.optim.lr_scheduler import CosineAnnealingLR


def build_optimizer(model, lr, epochs, weight_decay=0.01):
    """The optimizer and its schedule."""
    optimizer = AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99))
    scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
    return optimizer, scheduler


def get_batches(x, y, batch_size, seed):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    for idx in order.split(batch_size):
        yield x[idx], y[idx]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(2)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(360, 12, generator=gen)
    y = (x @ torch.randn(12, 4, generator=gen)).argmax(1)
    x_train, y_train, x_val, y_val = x[:280], y[:280], x[280:], y[280:]

    model = nn.Sequential(nn.Linear(12, 6), nn.GELU(), nn.Linear(6, 4))
    optimizer, scheduler = build_optimizer(model, args.lr, args.epochs)

    for epoch in range(args.epochs):
        model.train()
        for xb, yb in get_batches(x_train, y_train, 40, seed=epoch):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        with torch.no_grad():
            valid_accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
        print(epoch, round(valid_accuracy, 4))


if __name__ == "__main__":
    main()
