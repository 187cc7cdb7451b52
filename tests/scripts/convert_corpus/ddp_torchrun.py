"""DistributedDataParallel under torchrun (gloo on CPU, nccl on GPUs).

torchrun --nproc_per_node=2 ddp_torchrun.py --epochs 10
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
torch.set_num_threads(1)
torch.manual_seed(0)

gen = torch.Generator().manual_seed(9)
x = torch.randn(512, 8, generator=gen)
y = (x[:, :4].sum(1) * x[:, 4:].sum(1) > 0).long()
train_set = TensorDataset(x[:384], y[:384])
sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=32, sampler=sampler)
x_val, y_val = x[384:][rank::world], y[384:][rank::world]

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    scheduler.step()
    model.eval()
    with torch.no_grad():
        val_acc = (model(x_val).argmax(1) == y_val).float().mean().item()
    if rank == 0:
        print(f"epoch {epoch} val_acc {val_acc:.3f}")

dist.destroy_process_group()
