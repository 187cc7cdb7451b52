"""Classifier with ReduceLROnPlateau on the validation loss; batches via enumerate()."""
import argparse

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument('--epochs', type=int, default=25)
parser.add_argument('--lr', type=float, default=3e-3)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(1)
gen = torch.Generator().manual_seed(4)
features = torch.randn(400, 10, generator=gen)
labels = (features[:, :5].sum(1) > features[:, 5:].sum(1)).long()
train_loader = DataLoader(TensorDataset(features[:300], labels[:300]), batch_size=50,
                          shuffle=True)
val_x, val_y = features[300:], labels[300:]

net = nn.Sequential(
    nn.Linear(10, 5),
    nn.ReLU(),
    nn.Linear(5, 2),
)
loss_fn = nn.CrossEntropyLoss()
opt = optim.Adam(net.parameters(), lr=args.lr)
sched = optim.lr_scheduler.ReduceLROnPlateau(opt, mode='min', factor=0.5, patience=3)

for epoch in range(1, args.epochs + 1):
    net.train()
    running, batches = 0.0, 0
    for i, (xb, yb) in enumerate(train_loader):
        opt.zero_grad()
        out = net(xb)
        loss = loss_fn(out, yb)
        loss.backward()
        opt.step()
        running += loss.item()
        batches = i + 1
    net.eval()
    with torch.no_grad():
        val_loss = loss_fn(net(val_x), val_y).item()
        val_acc = (net(val_x).argmax(1) == val_y).float().mean().item()
    sched.step(val_loss)
    print(f"[{epoch}] train {running / batches:.3f} val_loss {val_loss:.3f} acc {val_acc:.3f}")
