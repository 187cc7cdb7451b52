# Regression on synthetic data, module-level script without argparse: the number of
# epochs comes from the EPOCHS environment variable. Plain SGD, no scheduler.
import os

import torch
import torch.nn as nn

EPOCHS = int(os.environ.get("EPOCHS", "30"))
torch.set_num_threads(1)
torch.manual_seed(0)

gen = torch.Generator().manual_seed(3)
x = torch.randn(320, 6, generator=gen)
y = (x[:, :3].sum(1, keepdim=True).tanh() + 0.5 * x[:, 3:5].prod(1, keepdim=True))
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]
batches = [(x_train[i:i + 32], y_train[i:i + 32]) for i in range(0, 256, 32)]

model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)  # lr given positionally

for epoch in range(EPOCHS):
    model.train()
    for batch in batches:
        inputs, targets = batch
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_loss = nn.functional.mse_loss(model(x_val), y_val).item()
    print(f"epoch {epoch} val_loss {val_loss:.4f}")
