"""A tiny GAN: two models, two optimizers (too irregular for an automatic conversion)."""
import torch
from torch import nn

torch.manual_seed(0)
real = torch.randn(256, 2) * 0.5 + 1.0
generator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
discriminator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()

for epoch in range(5):
    for i in range(0, 256, 32):
        fake = generator(torch.randn(32, 4))
        opt_d.zero_grad()
        d_loss = bce(discriminator(real[i:i + 32]), torch.ones(32, 1)) + \
            bce(discriminator(fake.detach()), torch.zeros(32, 1))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(discriminator(fake), torch.ones(32, 1))
        g_loss.backward()
        opt_g.step()
    with torch.no_grad():
        val_loss = (generator(torch.randn(256, 4)).mean(0) - real.mean(0)).abs().sum().item()
    print(epoch, val_loss)
