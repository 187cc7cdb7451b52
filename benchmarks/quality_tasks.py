"""The quality benchmark's tasks: data splits per seed, model builders and start widths.

Every task gives train/val/test tensors (standardized with the training statistics) and a
model builder taking a width: hidden units, or channels for the CNN (see quality.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

Split = tuple[torch.Tensor, torch.Tensor]

WIDTH_MULTIPLIERS: tuple[float, ...] = (1, 1.5, 2, 3, 4, 6)
"""Curve widths as multiples of the start width; 6x covers what 4 dendrite sets reach."""


@dataclass
class Task:
    """One benchmark problem: data splits, a model builder and how to train it."""

    name: str
    splits: dict[str, Split]
    build: Callable[[int], nn.Module]
    """Model of a given width (hidden units, or channels)."""
    width: int
    """Narrow start width: the 1x curve point and the network the arms grow."""
    scale: int = 1
    """Patience and epoch cap multiplier (two spirals needs long training)."""
    batch: int = 32


def _tensors(parts: dict[str, tuple[np.ndarray, np.ndarray]], mean: Any, std: Any,
             ) -> dict[str, Split]:
    return {k: (torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b))
            for k, (a, b) in parts.items()}


def _split_sklearn(loader: Callable, seed: int, per_feature: bool = True) -> dict[str, Split]:
    """Stratified 60/20/20 split, standardized with the training statistics (per feature, or
    one scalar for images); a feature constant in training keeps scale 1 (no 1e8 blow-ups)."""
    from sklearn.model_selection import train_test_split

    x, y = loader(return_X_y=True)
    x_tr, x_rest, y_tr, y_rest = train_test_split(x, y, test_size=0.4, stratify=y,
                                                  random_state=seed)
    x_va, x_te, y_va, y_te = train_test_split(x_rest, y_rest, test_size=0.5, stratify=y_rest,
                                              random_state=seed)
    if per_feature:
        mean, std = x_tr.mean(0), x_tr.std(0)
        std[std == 0] = 1.0
    else:
        mean, std = x_tr.mean(), x_tr.std()
    return _tensors({"train": (x_tr, y_tr), "val": (x_va, y_va), "test": (x_te, y_te)},
                    mean, std)


def mlp(inputs: int, width: int, depth: int, classes: int,
        act: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), act()]
        inputs = width
    return nn.Sequential(*layers, nn.Linear(inputs, classes))


def cnn(channels: int, classes: int = 10) -> nn.Sequential:
    """Tiny CNN for 8x8 images: two 3x3 convs of ``channels`` channels, one max-pool."""
    c = channels
    return nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(c * 16, classes))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: a 1x1 expansion to ``width`` channels, a 3x3 depthwise conv, a 1x1
    projection back to ``channels``, each with BatchNorm, and the residual add."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(channels, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6(),
            nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False),
            nn.BatchNorm2d(width), nn.ReLU6(),
            nn.Conv2d(width, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def mbconv(width: int, classes: int = 10, channels: int = 8) -> nn.Sequential:
    """A tiny MobileNetV2 for 8x8 images: a 3x3 stem of ``channels``, two inverted residual
    blocks expanding to ``width`` (the curve's width) around a max-pool, a linear head."""
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU6(),
        InvertedResidual(channels, width), nn.MaxPool2d(2), InvertedResidual(channels, width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


def _sklearn_task(name: str, loader: Callable, width: int, seed: int) -> Task:
    splits = _split_sklearn(loader, seed)
    inputs, classes = splits["train"][0].shape[1], int(splits["train"][1].max()) + 1
    return Task(name, splits, lambda w: mlp(inputs, w, 1, classes), width)


def digits(seed: int) -> Task:
    from sklearn.datasets import load_digits
    return _sklearn_task("digits", load_digits, 8, seed)


def wine(seed: int) -> Task:
    from sklearn.datasets import load_wine
    return _sklearn_task("wine", load_wine, 4, seed)


def breast_cancer(seed: int) -> Task:
    from sklearn.datasets import load_breast_cancer
    return _sklearn_task("breast_cancer", load_breast_cancer, 4, seed)


def two_spirals(offset: float) -> Split:
    """Lang & Witbrock's two spirals (97 points per class); ``offset`` shifts the angles."""
    i = np.arange(97) + offset
    angle = i * math.pi / 16
    radius = 6.5 * (104 - i) / 104
    a = np.stack([radius * np.sin(angle), radius * np.cos(angle)], 1)
    x = np.concatenate([a, -a]) * (3 / 6.5)  # radius <= 3: tanh units resolve the turns
    y = np.concatenate([np.zeros(97), np.ones(97)]).astype(np.int64)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def spirals(seed: int) -> Task:
    """Train on the classic 194 points; validate and test on points halfway between (the
    data do not depend on the seed, only the initialization and batch order do)."""
    x_mid, y_mid = two_spirals(0.5)
    splits = {"train": two_spirals(0.0), "val": (x_mid[::2], y_mid[::2]),
              "test": (x_mid[1::2], y_mid[1::2])}
    return Task("spirals", splits, lambda w: mlp(2, w, 2, 2), 8, scale=5)


@functools.lru_cache(maxsize=1)
def _mnist1d_raw() -> dict[str, np.ndarray]:
    """The default MNIST-1D dataset (deterministic, ~1 s to generate; cached per process)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise SystemExit("the mnist1d task needs the mnist1d package: pip install -e "
                         "'.[bench]' (or leave it out: --datasets digits wine ...)") from exc

    return make_dataset(get_dataset_args())


def mnist1d(seed: int) -> Task:
    """3200/800 train/val by a seeded permutation of the 4000 training sequences; the 1000
    test sequences as test; standardized with the training statistics."""
    raw = _mnist1d_raw()
    perm = np.random.default_rng(seed).permutation(len(raw["x"]))
    tr, va = perm[:3200], perm[3200:]
    x, y = raw["x"], raw["y"]
    mean, std = x[tr].mean(0), x[tr].std(0)
    splits = _tensors({"train": (x[tr], y[tr]), "val": (x[va], y[va]),
                       "test": (raw["x_test"], raw["y_test"])}, mean, std)
    return Task("mnist1d", splits, lambda w: mlp(40, w, 1, 10, nn.ReLU), 16, batch=128)


def digits_cnn(seed: int) -> Task:
    """The digits split of the same seed, as (N, 1, 8, 8) images, one scalar standardization."""
    from sklearn.datasets import load_digits

    splits = {k: (x.reshape(-1, 1, 8, 8), y)
              for k, (x, y) in _split_sklearn(load_digits, seed, per_feature=False).items()}
    return Task("digits_cnn", splits, cnn, 4)


def digits_mbconv(seed: int) -> Task:
    """The digits images of :func:`digits_cnn` through :func:`mbconv`, expanding to 8 at the
    start (a ratio of 1): the widths grown and curved are the blocks' expansions."""
    return Task("digits_mbconv", load_task("digits_cnn", seed).splits, mbconv, 8)


TASKS: dict[str, Callable[[int], Task]] = {
    "digits": digits, "wine": wine, "breast_cancer": breast_cancer, "spirals": spirals,
    "mnist1d": mnist1d, "digits_cnn": digits_cnn, "digits_mbconv": digits_mbconv}

NAMED_ONLY = ("digits_mbconv",)
"""Tasks a run leaves out unless ``--datasets`` names them (measured apart from the stored run)."""


def default_tasks() -> list[str]:
    """The tasks a run without ``--datasets`` runs: the stored run's six."""
    return [name for name in TASKS if name not in NAMED_ONLY]

COST = {"mnist1d": 4, "digits_cnn": 4, "digits_mbconv": 6, "digits": 2, "spirals": 2,
        "wine": 1, "breast_cancer": 1}
"""Rough relative run cost, to start the long runs first (better packing across jobs)."""


@functools.lru_cache(maxsize=8)
def load_task(name: str, seed: int) -> Task:
    """The task's data for one seed (cached: a worker reuses it across widths and arms)."""
    return TASKS[name](seed)


def curve_widths(start: int) -> list[int]:
    """The width curve's widths for a task that starts at ``start``."""
    return sorted({max(1, round(start * m)) for m in WIDTH_MULTIPLIERS})
