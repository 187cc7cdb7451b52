"""A PerforatedAI-style script converted for DataParallel exactly as PerforatedAI's recipe says:
the --perforate_model_parallel initialization run (exits after the first backward), then
the normal run that wraps the model in torch.nn.DataParallel.

Only the two imports differ from a script written for PerforatedAI.
"""

import argparse
import json

import torch
from safetensors.torch import save_file

from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA

parser = argparse.ArgumentParser()
parser.add_argument('--save_name', type=str, default='PAI')
parser.add_argument('--perforate_model_parallel', action='store_true',
                    help='Initialize PAI settings for multi-GPU (run once on single GPU)')
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
gen = torch.Generator().manual_seed(2)
x = torch.randn(384, 8, generator=gen)
teacher = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
with torch.no_grad():
    y = teacher(x).argmax(1)
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]
probe = torch.randn(16, 8, generator=gen)
train_loader = [(x_train[i:i + 64], y_train[i:i + 64]) for i in range(0, 256, 64)]

GPA.pc.set_testing_dendrite_capacity(False)
GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
GPA.pc.set_fixed_switch_num(3)
GPA.pc.set_max_dendrites(1)
GPA.pc.set_max_dendrite_tries(1)
GPA.pc.set_verbose(False)

model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
model = UPA.perforate_model(model, save_name=args.save_name, maximizing_score=True)
model = model.to(device)

# PAI multi-GPU setup - initialize on single GPU, then use DataParallel
if not args.perforate_model_parallel:
    # Normal training mode - load settings and wrap with DataParallel
    GPA.pai_tracker.initialize_tracker_settings()
    model = torch.nn.DataParallel(model)
# else: initialization mode - stay on single GPU, will save settings after first batch

GPA.pai_tracker.set_optimizer(torch.optim.Adam)  # SAME optimizer type
GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)  # SAME scheduler type
optimArgs = {'params': model.parameters(), 'lr': 0.01, 'weight_decay': 1e-4}  # SAME args
schedArgs = {'step_size': 30, 'gamma': 0.1}  # SAME scheduler args
optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)

restructures = 0
for _epoch in range(60):
    model.train()
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()

        # Pre-initialize gradients for multi-GPU compatibility (optional)
        for param in model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)

        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()

        # PAI initialization mode - save settings and exit after FIRST batch
        if args.perforate_model_parallel:
            GPA.pai_tracker.save_tracker_settings()
            print(f"PAI multi-GPU settings saved to {args.save_name}/")
            print("Initialization complete. Now run without --perforate_model_parallel flag for training.")  # noqa: E501
            exit(0)

        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_acc = (model(x_val.to(device)).argmax(1) == y_val.to(device)).float().mean().item()
    model.module, restructured, training_complete = GPA.pai_tracker.add_validation_score(
        val_acc, model.module)
    model = model.to(device)
    if training_complete:
        break
    elif restructured:
        restructures += 1
        optimArgs = {'params': model.parameters(), 'lr': 0.01, 'weight_decay': 1e-4}
        optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)

with torch.no_grad():
    out = model(probe.to(device)).cpu().contiguous()
save_file({"out": out}, f"{args.save_name}/final_outputs.safetensors")
ctl = GPA.pai_tracker.controller
print(json.dumps({"complete": bool(training_complete), "restructures": restructures,
                  "dendrites": ctl.num_dendrites, "epochs": ctl.epoch,
                  "wrapper": type(model).__name__}))
