"""Zoo models (GPT-2 and BERT) through the Hugging Face Trainer with DendriteGrowthCallback:
a run that grows and checkpoints every epoch, resumed from the checkpoint of its first growth
step, ends with the same weights and decisions as the uninterrupted run, and the grown model
that ``save_model`` writes reloads onto a freshly built model with equal outputs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import perfora  # noqa: E402
from perfora.integrations.transformers import (  # noqa: E402
    CONTROLLER_FILE,
    DendriteGrowthCallback,
    load_grown_pretrained,
)
from tests.support.zoo import ZooModel, feed, hf_models  # noqa: E402

ZOO = {z.name: z for z in hf_models()}
EPOCHS = 3
EXAMPLES = 8
BATCH = 4  # 2 steps per epoch


def _examples(name: str, seed: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 64, (EXAMPLES, 8), generator=torch.Generator().manual_seed(seed))
    labels = ids if name == "gpt2" else ids.sum(1) % 3
    return [{"input_ids": ids[i], "labels": labels[i]} for i in range(EXAMPLES)]


def _trainer(zoo: ZooModel, out: Path) -> tuple[Trainer, DendriteGrowthCallback]:
    """A Trainer over the freshly built entry, growing one set after epochs 1 and 2 and
    completing (rewinding to the best model) after epoch 3."""
    args = TrainingArguments(
        output_dir=str(out), num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=EXAMPLES, learning_rate=1e-3, eval_strategy="epoch",
        save_strategy="epoch", logging_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, use_cpu=True, seed=0)
    trainer = Trainer(model=zoo.build().train(), args=args,
                      train_dataset=_examples(zoo.name, 1), eval_dataset=_examples(zoo.name, 2))
    growth = DendriteGrowthCallback(
        monitor="eval_loss", max_dendrites=2, switch_mode="fixed", fixed_switch_num=1,
        dendrite_init="default", write_files=False, restore_best_at_end=False, seed=0,
        growth="dendrites",
        perforate_kwargs=zoo.perforate_kwargs).bind(trainer)
    return trainer, growth


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _out(zoo: ZooModel, model: torch.nn.Module) -> torch.Tensor:
    fed, args = feed(zoo, model.eval())
    with torch.no_grad():
        return fed(*args)


@pytest.mark.parametrize("name", ["gpt2", "bert-cls"])
def test_trainer_checkpoint_resume_and_save_model_round_trip(name, tmp_path):
    zoo = ZOO[name]
    trainer, growth = _trainer(zoo, tmp_path / "run")
    trainer.train()
    events = [row["event"] for row in growth.controller.state.history]
    assert events == ["restructure", "restructure", "complete"]  # completion: the best model
    counts = {layer.num_dendrites for layer in perfora.dendritic_layers(trainer.model).values()}
    assert counts == {growth.controller.num_dendrites} and counts != {0}
    # resume from the checkpoint written at the first growth step (after epoch 1)
    first = tmp_path / "run" / f"checkpoint-{EXAMPLES // BATCH}"
    assert (first / CONTROLLER_FILE).is_file()
    resumed, again = _trainer(zoo, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(first))
    assert [row["event"] for row in again.controller.state.history] == events
    assert _digest(resumed.model) == _digest(trainer.model)
    # save_model, then reload onto a freshly built model
    trainer.save_model(str(tmp_path / "saved"))
    fresh = load_grown_pretrained(zoo.build(), tmp_path / "saved", **zoo.perforate_kwargs)
    assert torch.equal(_out(zoo, fresh), _out(zoo, trainer.model))
