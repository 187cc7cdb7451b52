"""DataParallel training (runs on CPU too, where DataParallel calls the module directly)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(5)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
gen = torch.Generator().manual_seed(8)
x = torch.randn(384, 8, generator=gen)
y = (torch.tanh(x @ torch.randn(8, 3, generator=gen))).argmax(1)
train_loader = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=64)
x_val, y_val = x[256:].to(device), y[256:].to(device)

model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)).to(device)
model = nn.DataParallel(model)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

for epoch in range(args.epochs):
    model.train()
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_acc = (model(x_val).argmax(1) == y_val).float().mean().item()
    print(f"epoch {epoch}: {val_acc:.3f}")
