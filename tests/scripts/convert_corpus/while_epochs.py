"""A while loop over epochs and a metric named val_score; RMSprop via `from torch import optim`."""
import os

import torch
from torch import nn, optim

max_epochs = int(os.environ.get("EPOCHS", "25"))
torch.set_num_threads(1)
torch.manual_seed(7)
gen = torch.Generator().manual_seed(12)
inputs = torch.randn(300, 5, generator=gen)
targets = ((inputs ** 2).sum(1) > 5).long()
loader = [(inputs[i:i + 50], targets[i:i + 50]) for i in range(0, 250, 50)]

classifier = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
optimizer = optim.RMSprop(classifier.parameters(), lr=0.01)

epoch = 0
while epoch < max_epochs:
    classifier.train()
    for batch_x, batch_y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(classifier(batch_x), batch_y).backward()
        optimizer.step()
    classifier.eval()
    with torch.no_grad():
        val_score = (classifier(inputs[250:]).argmax(1) == targets[250:]).float().mean().item()
    print(epoch, val_score)
    epoch += 1
