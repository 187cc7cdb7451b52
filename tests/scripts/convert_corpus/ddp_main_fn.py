"""DDP in a main() function: settings from the environment, a separate DDP-wrapped name."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    dist.init_process_group(backend="gloo")
    return dist.get_rank(), dist.get_world_size()


def evaluate(net, x, y):
    net.eval()
    with torch.no_grad():
        return nn.functional.mse_loss(net(x), y).item()


def main():
    rank, world = setup()
    epochs = int(os.environ.get("EPOCHS", "20"))
    torch.set_num_threads(1)
    torch.manual_seed(42)
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(384, 6, generator=gen)
    y = torch.tanh(x[:, :3].sum(1, keepdim=True)) * x[:, 3:4]
    x_train, y_train = x[:256][rank::world], y[:256][rank::world]
    x_val, y_val = x[256:][rank::world], y[256:][rank::world]

    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 1))
    ddp_model = DDP(
        model,
        find_unused_parameters=False,
        gradient_as_bucket_view=True,
    )
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=5e-3)

    for epoch in range(epochs):
        ddp_model.train()
        perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        for idx in perm.split(16):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp_model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
        val_loss = evaluate(ddp_model, x_val, y_val)
        if rank == 0:
            print(f"epoch {epoch}: val_loss={val_loss:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
