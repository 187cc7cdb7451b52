"""Everything inside main(): nested train/validate closures over the model and optimizer."""
import sys

import torch
from torch import nn


def main(epochs: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(3)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(300, 8, generator=gen)
    y = torch.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]
    x_train, y_train, x_val, y_val = x[:240], y[:240], x[240:], y[240:]

    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.005, alpha=0.95)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.98)

    def train_one_epoch(epoch):
        model.train()
        total = 0.0
        for start in range(0, len(x_train), 48):
            xb, yb = x_train[start:start + 48], y_train[start:start + 48]
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
        return total

    def validate():
        model.eval()
        with torch.no_grad():
            return nn.functional.mse_loss(model(x_val), y_val).item()

    for epoch in range(epochs):
        train_loss = train_one_epoch(epoch)
        scheduler.step()
        val_mse = validate()
        print(f"{epoch}: train {train_loss:.3f} val {val_mse:.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
