"""A PerforatedAI-style training script, single process, with the multi-GPU recipe's DDP-section
checkpoint loading (highest switch_N) so it can also be restarted after each restructure.

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
parser.add_argument('--pai_load_folder', type=str, default=None,
                    help='Folder to load PAI state from (for automatic resumption)')
parser.add_argument('--exit_on_restructure', action='store_true',
                    help='exit after dendrites are added (the DDP restart workflow)')
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
x = torch.randn(384, 8, generator=gen)
teacher = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
with torch.no_grad():
    y = teacher(x).argmax(1)
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]
probe = torch.randn(16, 8, generator=gen)

GPA.pc.set_testing_dendrite_capacity(False)
GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
GPA.pc.set_fixed_switch_num(3)
GPA.pc.set_max_dendrites(2)
GPA.pc.set_max_dendrite_tries(1)
GPA.pc.set_n_epochs_to_switch(3)
GPA.pc.set_improvement_threshold([0.001, 0.0001, 0])
GPA.pc.set_unwrapped_modules_confirmed(True)

model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
model = UPA.perforate_model(model, save_name=args.save_name, maximizing_score=False)

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
            except:  # noqa: E722 - as the recipe writes it
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

restructures = 0
for _epoch in range(60):
    model.train()
    for start in range(0, len(x_train), 64):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[start:start + 64]),
                                                 y_train[start:start + 64])
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_loss = torch.nn.functional.cross_entropy(model(x_val), y_val).item()
        train_acc = (model(x_train).argmax(1) == y_train).float().mean().item()
    GPA.pai_tracker.add_extra_score(train_acc, 'Train Acc')
    GPA.pai_tracker.add_test_score(val_loss, 'Test Loss')
    model, restructured, training_complete = GPA.pai_tracker.add_validation_score(val_loss, model)
    if training_complete:
        break
    elif restructured:
        restructures += 1
        if args.exit_on_restructure:
            print(json.dumps({"exited_after_restructure": True}))
            exit(0)
        optimArgs = {'params': model.parameters(), 'lr': 0.01, 'weight_decay': 1e-4}
        optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs)

with torch.no_grad():
    save_file({"out": model(probe).contiguous()}, f"{args.save_name}/final_outputs.safetensors")
ctl = GPA.pai_tracker.controller
print(json.dumps({"complete": bool(training_complete), "restructures": restructures,
                  "dendrites": ctl.num_dendrites, "epochs": ctl.epoch,
                  "switch_epochs": ctl.state.switch_epochs}))
