"""A complete training loop with perfora's native API (runs as is: python examples/native_loop.py).

The same code is shown in the README. It trains a narrow MLP on scikit-learn's digits and
lets perfora grow it (dendrites, or neurons where those pay) whenever the validation
accuracy stops improving.
"""

import torch
from sklearn.datasets import load_digits
from torch import nn

import perfora

torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16
y = torch.tensor(digits.target)
x_train, y_train, x_val, y_val = x[:1200], y[:1200], x[1200:], y[1200:]

model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
model = perfora.perforate(model)  # wraps both Linear layers; prints nothing unless verbose=True

controller = perfora.GrowthController(
    model,
    perfora.PerforaConfig(maximize=True, n_epochs_to_switch=8, max_dendrites=2),
    run_dir="perfora_runs/native_loop",  # checkpoints, metrics.csv, history.png
)
controller.set_optimizer(torch.optim.Adam, lr=3e-3)  # rebuilt after every restructure
controller.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=20, gamma=0.5)
optimizer, scheduler = controller.build_optimizer()

for _epoch in range(500):
    model.train()
    for idx in torch.randperm(len(x_train)).split(64):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_acc = (model(x_val).argmax(1) == y_val).float().mean().item()
    decision = controller.step(val_acc)  # the controller steps the scheduler itself
    if decision.restructured or decision.complete:  # what grew or ended, where, and why
        print(f"epoch {decision.epoch}: {decision.reason}")
    if decision.restructured:  # the model grew: use the rebuilt optimizer
        optimizer, scheduler = decision.optimizer, decision.scheduler
    if decision.complete:  # the model now holds its best weights
        break

print(f"{controller.num_dendrites} dendrite set(s), hidden width {model[0].num_neurons}, "
      f"best validation accuracy {controller.best_score:.3f} after {controller.epoch} epochs")
