"""A DDP training script that follows the PerforatedAI multi-GPU recipe literally (GPA/UPA names).

Both flags, ``load_system`` from the highest ``switch_N``, ``setup_optimizer`` after it, DDP
with ``find_unused_parameters=True``, zero-filled gradients before ``backward()``, every rank
calling ``add_validation_score``, and an exit after each restructure. Run it with
``perfora launch --nproc-per-node 2 --init pai_ddp_train.py --out DIR``.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True, help="folder for the per-rank result files")
parser.add_argument('--perforate_model_parallel', action='store_true',
                    help='Initialize PAI settings for DDP (run once)')
parser.add_argument('--pai_load_folder', type=str, default=None,
                    help='Folder to load PAI state from (for automatic resumption)')
args = parser.parse_args()
args.distributed = "RANK" in os.environ and not args.perforate_model_parallel

torch.set_num_threads(1)
if args.distributed:
    dist.init_process_group("gloo")
rank = dist.get_rank() if args.distributed else 0
world = dist.get_world_size() if args.distributed else 1
os.makedirs(args.out, exist_ok=True)


def leave() -> None:
    """Exit 0 together, as a user's script ends: the group torn down, the interpreter left
    normally (perfora settles gloo's threads at exit, so no rank aborts)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)


gen = torch.Generator().manual_seed(0)
x = torch.randn(384, 8, generator=gen)
y = (x[:, :4].sum(1, keepdim=True).tanh() + 0.3 * x[:, 4:6].prod(1, keepdim=True))
x_train, y_train = x[:256][rank::world], y[:256][rank::world]
x_val, y_val = x[256:][rank::world], y[256:][rank::world]

GPA.pc.set_testing_dendrite_capacity(False)
GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
GPA.pc.set_fixed_switch_num(3)
GPA.pc.set_max_dendrites(2)
GPA.pc.set_retain_all_dendrites(True)

torch.manual_seed(1234 + rank)  # rank-dependent init: DDP must broadcast rank 0's weights
model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 1))
model = UPA.perforate_model(model, save_name="PAI", maximizing_score=False)

# Load checkpoint if resuming from dendrite restructure (DDP mode)
if args.pai_load_folder is not None:
    # Find the highest numbered switch_x.pt file
    import glob
    switch_files = glob.glob(f"{args.pai_load_folder}/switch_*.pt")
    if switch_files:
        # Extract switch numbers and find the maximum
        switch_numbers = []
        for f in switch_files:
            try:
                num = int(f.split('switch_')[1].split('.pt')[0])
                switch_numbers.append(num)
            except:  # noqa: E722 (the recipe's code, as written)
                pass
        if switch_numbers:
            max_switch = max(switch_numbers)
            model = UPA.load_system(model, args.pai_load_folder, f'switch_{max_switch}', True)
            print(f"Loaded PAI state from {args.pai_load_folder}/switch_{max_switch}.pt")
        else:
            print(f"Starting from beginning (no valid switch_x.pt found in {args.pai_load_folder})")
    else:
        print(f"Starting from beginning (no switch_x.pt files found in {args.pai_load_folder})")

GPA.pai_tracker.set_optimizer(torch.optim.Adam)
GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)
optimArgs = {'params': model.parameters(), 'lr': 0.01, 'weight_decay': 1e-4}
schedArgs = {'step_size': 30, 'gamma': 0.1}
optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)

# PAI DDP setup - initialize on single GPU, then use DDP
if not args.perforate_model_parallel:
    # Normal training mode - initialize settings and wrap with DDP
    GPA.pai_tracker.initialize_tracker_settings()

    # Wrap with DDP - IMPORTANT: find_unused_parameters=True is required for PerforatedAI
    model = torch.nn.parallel.DistributedDataParallel(
        model,
        find_unused_parameters=True  # Required for PerforatedAI dendrite growth
    )
# else: initialization mode - stay on single GPU, will save settings after first batch

for epoch in range(1, 100):
    model.train()
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    for idx in order.split(16):
        optimizer.zero_grad()

        # Pre-initialize gradients for DDP compatibility
        # PerforatedAI's selective training means some params won't get gradients from backward()
        # Initialize them to zero so DDP's allreduce doesn't encounter None
        if args.distributed:
            for param in model.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)

        loss = nn.functional.mse_loss(model(x_train[idx]), y_train[idx])
        loss.backward()

        # PAI initialization mode - save settings and exit after FIRST batch
        if args.perforate_model_parallel:
            GPA.pai_tracker.save_tracker_settings()
            print("PAI multi-GPU settings saved to PAI/")
            print("Initialization complete. Now run without --perforate_model_parallel flag "
                  "for training.")
            exit(0)

        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_loss = nn.functional.mse_loss(model(x_val), y_val).item()
    model, restructured, training_complete = GPA.pai_tracker.add_validation_score(val_loss,
                                                                                  model)
    if training_complete:
        break
    if restructured:  # dendrites were added: exit; the launcher restarts and resumes
        print(f"rank {rank}: restructured after epoch {epoch}, exiting to restart")
        leave()

inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
flat = torch.cat([p.detach().flatten() for p in inner.parameters()])
with open(os.path.join(args.out, f"params_rank{rank}.json"), "w") as handle:
    json.dump({"dendrites": GPA.pai_tracker.controller.num_dendrites,
               "epoch": GPA.pai_tracker.controller.epoch, "params": flat.tolist()}, handle)
leave()
