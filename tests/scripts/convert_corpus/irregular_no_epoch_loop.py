"""Iteration-based training (no epochs, no validation score per epoch)."""
import torch
from torch import nn

torch.manual_seed(0)
data = torch.randn(1000, 8)
target = data[:, :1] * 2 - data[:, 1:2]
model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

max_iters = 200
for it in range(max_iters):
    idx = torch.randint(0, 1000, (32,))
    loss = nn.functional.mse_loss(model(data[idx]), target[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 50 == 0:
        print(it, loss.item())
