"""A tiny Hugging Face model and data set for the Trainer tests (built from a config, no
download): an MLP classifier as a ``PreTrainedModel`` and a classification set made in code."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput


class TinyConfig(PretrainedConfig):
    """Sizes of the tiny MLP classifier."""

    model_type = "perfora_tiny_mlp"

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 3,
                 **kwargs: Any) -> None:
        self.features, self.hidden, self.classes = features, hidden, classes
        super().__init__(**kwargs)


class TinyClassifier(PreTrainedModel):
    """features -> hidden -> hidden -> classes, with a cross-entropy loss given labels."""

    config_class = TinyConfig
    base_model_prefix = "tiny"

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.encoder = nn.Sequential(nn.Linear(config.features, config.hidden), nn.Tanh(),
                                     nn.Linear(config.hidden, config.hidden), nn.Tanh())
        self.head = nn.Linear(config.hidden, config.classes)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Keep torch's default init (deterministic under the seed)."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None
                ) -> SequenceClassifierOutput:
        logits = self.head(self.encoder(x))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class Blobs(Dataset):
    """``n`` points around ``classes`` random centres: dicts with ``x`` and ``labels``."""

    def __init__(self, n: int, seed: int, features: int = 8, classes: int = 3) -> None:
        g = torch.Generator().manual_seed(seed)
        centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(7))
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.x = centres[self.labels] + 1.5 * torch.randn(n, features, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.labels[i]}


def accuracy(pred: Any) -> dict[str, float]:
    """compute_metrics: the share of argmax predictions equal to the labels."""
    logits, labels = pred.predictions, pred.label_ids
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def make_trainer(out: str, *, epochs: int, seed: int = 0, train: Dataset | None = None,
                 save: bool = False, **extra: Any) -> Trainer:
    """A Trainer over a fresh TinyClassifier (seeded), evaluating every epoch."""
    torch.manual_seed(seed)
    model = TinyClassifier(TinyConfig())
    args = TrainingArguments(
        output_dir=out, num_train_epochs=epochs, per_device_train_batch_size=16,
        per_device_eval_batch_size=64, learning_rate=0.02, eval_strategy="epoch",
        save_strategy="epoch" if save else "no", logging_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, optim="adamw_torch", use_cpu=True, seed=seed,
        **extra)
    return Trainer(model=model, args=args, train_dataset=train or Blobs(96, 1),
                   eval_dataset=Blobs(64, 2), compute_metrics=accuracy)


def digest(model: nn.Module) -> str:
    """sha256 over every tensor of the model's state, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
