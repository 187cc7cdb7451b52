"""DendriteGrowth reads the saved dendrite structure from a Lightning checkpoint before the
strategy loads it (ModelParallel, FSDP, DeepSpeed): from each checkpoint layout, with
``torch.load(weights_only=True)``, and never by running code stored in the file."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from perfora.errors import CheckpointError
from perfora.integrations.lightning import DendriteGrowth, saved_callback_state

KEY = DendriteGrowth(monitor="val_acc", mode="max").state_key
STATE = {"structure": {"net.0": {"num_dendrites": 1}}, "controller": {"epoch": 3},
         "best": {"net.0.weight": torch.ones(2, 3)}}


class MarkerOnUnpickle:
    """Unpickling this object creates the file at ``marker`` (as a malicious pickle would)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def checkpoint(**extra) -> dict:
    return {"epoch": 2, "state_dict": {"net.0.weight": torch.zeros(2, 3)},
            "callbacks": {KEY: STATE, "ModelCheckpoint{}": {"best_model_path": "x"}}, **extra}


@pytest.mark.parametrize("layout", ["file", "distributed folder", "deepspeed folder"])
def test_the_callback_state_is_read_from_every_checkpoint_layout(tmp_path, layout):
    path = {"file": tmp_path / "last.ckpt", "distributed folder": tmp_path / "last.ckpt",
            "deepspeed folder": tmp_path / "last.ckpt"}[layout]
    source = {"file": path, "distributed folder": path / "meta.pt",
              "deepspeed folder": path / "checkpoint" / "mp_rank_00_model_states.pt"}[layout]
    source.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint(), source)
    saved = saved_callback_state(path, KEY)
    assert saved["structure"] == STATE["structure"] and saved["controller"] == {"epoch": 3}
    assert torch.equal(saved["best"]["net.0.weight"], torch.ones(2, 3))
    assert saved_callback_state(path, "OtherCallback") is None


def test_a_folder_without_a_checkpoint_file_has_no_saved_state(tmp_path):
    assert saved_callback_state(tmp_path, KEY) is None
    assert saved_callback_state(tmp_path / "missing.ckpt", KEY) is None


def test_the_marker_object_does_create_its_file_when_unpickled(tmp_path):
    # guard for the test below: the trap really fires when something unpickles it
    marker = tmp_path / "fired"
    pickle.loads(pickle.dumps(MarkerOnUnpickle(marker))).close()
    assert marker.exists()


def test_a_checkpoint_holding_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "hostile.ckpt"
    torch.save(checkpoint(hyper_parameters=MarkerOnUnpickle(marker)), path)
    with pytest.raises(CheckpointError, match=r"weights_only=True.*add_safe_globals"):
        saved_callback_state(path, KEY)
    assert not marker.exists(), "perfora ran code stored in a Lightning checkpoint"
