"""A small CNN on synthetic 8x8 images: SGD with momentum and MultiStepLR, argparse."""
import argparse

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        return self.head(x.flatten(1))


def make_images(n, gen):
    labels = torch.randint(0, 3, (n,), generator=gen)
    images = torch.randn(n, 1, 8, 8, generator=gen) * 0.5
    images[labels == 0, :, :4, :] += 1.0   # bright top
    images[labels == 1, :, :, :4] += 1.0   # bright left
    return images, labels


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(6)
    gen = torch.Generator().manual_seed(11)
    train_x, train_y = make_images(256, gen)
    val_x, val_y = make_images(96, gen)

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=args.momentum,
                                nesterov=True)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [8, 12], gamma=0.2)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        for i in range(0, len(train_x), 32):
            optimizer.zero_grad()
            loss = criterion(model(train_x[i:i + 32]), train_y[i:i + 32])
            loss.backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        with torch.no_grad():
            test_acc = (model(val_x).argmax(1) == val_y).float().mean().item()
        print(f"epoch {epoch + 1}: accuracy {test_acc:.3f}")
