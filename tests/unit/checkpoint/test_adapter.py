"""Dendrites as an adapter: a small file with only what growth added, applied to a fresh
base model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora
from perfora.checkpoint.format import save_checkpoint
from perfora.nn.perforation import layer_specs


def _pretrained(seed: int = 0, width: int = 64) -> nn.Module:
    """Stands for a pretrained model: the same seed gives the same weights."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 4))


def _adapted(tmp_path, selective: bool = True):
    model = _pretrained()
    for p in model.parameters():
        p.requires_grad_(False)
    perfora.perforate(model)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        for layer in perfora.dendritic_layers(model).values():
            layer.grow(generator, neurons=[0, 3] if selective else None)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for _ in range(5):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    path = tmp_path / "adapter.safetensors"
    perfora.save_dendrites(model, path)
    return model.eval(), path, x


def test_dendrites_file_holds_only_what_growth_added_and_restores_the_model(tmp_path):
    model, path, x = _adapted(tmp_path)
    perfora.save_model(tmp_path / "full.safetensors", model)
    assert path.stat().st_size < 0.5 * (tmp_path / "full.safetensors").stat().st_size
    stored = perfora.load_checkpoint(path).tensors["dendrites"]
    assert stored and not any(".base." in key for key in stored)

    fresh = _pretrained()  # unconverted, with the same pretrained weights
    perfora.load_dendrites(fresh, path)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    assert [layer.num_dendrites for layer in perfora.dendritic_layers(fresh).values()] == [2] * 3


def test_full_sets_round_trip_into_an_already_perforated_model(tmp_path):
    model, path, x = _adapted(tmp_path, selective=False)
    fresh = perfora.perforate(_pretrained())
    perfora.load_dendrites(fresh, path)
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), model(x))


def test_other_base_weights_load_with_a_warning(tmp_path):
    _, path, _ = _adapted(tmp_path)
    with pytest.warns(UserWarning, match=r"base weights of \['0', '2', '4'\] differ"):
        perfora.load_dendrites(_pretrained(seed=7), path)


def test_a_base_model_of_another_shape_is_refused_and_left_unchanged(tmp_path):
    _, path, _ = _adapted(tmp_path)
    other = _pretrained(width=32)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(perfora.ShapeMismatchError, match="neurons"):
        perfora.load_dendrites(other, path)
    assert not perfora.dendritic_layers(other)
    assert other.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())


def test_full_checkpoint_is_not_a_dendrites_file(tmp_path):
    model, _, _ = _adapted(tmp_path)
    perfora.save_model(tmp_path / "full.safetensors", model)
    with pytest.raises(perfora.CheckpointError, match="not a dendrites file"):
        perfora.load_dendrites(_pretrained(), tmp_path / "full.safetensors")


def test_saving_an_unperforated_model_is_an_error(tmp_path):
    with pytest.raises(perfora.CheckpointError, match="no dendritic layers"):
        perfora.save_dendrites(_pretrained(), tmp_path / "x.safetensors")


# ---------------------------------------------------------------- refused loads change nothing
def _frozen(model: nn.Module) -> tuple[dict, dict]:
    """The model's tensors (cloned) and structure, to compare after a refused load."""
    return ({k: v.clone() for k, v in model.state_dict().items()},
            layer_specs(model) if perfora.dendritic_layers(model) else {})


def _assert_unchanged(model: nn.Module, before: tuple[dict, dict]) -> None:
    tensors, specs = before
    now = model.state_dict()
    assert now.keys() == tensors.keys()
    assert all(torch.equal(now[k], v) for k, v in tensors.items())
    assert (layer_specs(model) if perfora.dendritic_layers(model) else {}) == specs


def _crafted(tmp_path, edit) -> object:
    """The selective adapter file, changed by ``edit(tensors, meta)`` and written again."""
    _, path, _ = _adapted(tmp_path)
    ckpt = perfora.load_checkpoint(path)
    edit(ckpt.tensors["dendrites"], ckpt.meta)
    out = tmp_path / "crafted.safetensors"
    save_checkpoint(out, ckpt)
    return out


def _empty_row(tensors, meta):
    tensors["2.dendrite_mask"][1] = False


def _other_neurons(tensors, meta):  # the mask feeds neurons 1 and 2, the structure says 0, 3
    mask = tensors["2.dendrite_mask"]
    mask[1] = False
    mask[1, [1, 2]] = True


def _nan_weight(tensors, meta):
    tensors["2.out_weight"][0, 0] = float("nan")


def _mask_of_another_shape(tensors, meta):
    tensors["2.dendrite_mask"] = torch.ones(3, 64, dtype=torch.bool)


@pytest.mark.parametrize("edit, match", [
    (_empty_row, "empty"), (_other_neurons, "structure"), (_nan_weight, "finite"),
    (_mask_of_another_shape, "shape"),
])
@pytest.mark.parametrize("perforated", [False, True])
def test_a_crafted_adapter_is_refused_before_the_model_changes(tmp_path, edit, match,
                                                               perforated):
    path = _crafted(tmp_path, edit)
    fresh = _pretrained()
    if perforated:
        perfora.perforate(fresh)
    before = _frozen(fresh)
    with pytest.raises(perfora.CheckpointError, match=match):
        perfora.load_dendrites(fresh, path)
    _assert_unchanged(fresh, before)
    assert bool(perfora.dendritic_layers(fresh)) == perforated


def test_loading_over_existing_dendrites_needs_replace(tmp_path):
    model, path, x = _adapted(tmp_path)
    other = _pretrained()
    perfora.perforate(other)
    generator = torch.Generator().manual_seed(5)
    for layer in perfora.dendritic_layers(other).values():
        layer.grow(generator)
    before = _frozen(other)
    with pytest.raises(perfora.CheckpointError, match="replace=True"):
        perfora.load_dendrites(other, path)
    _assert_unchanged(other, before)
    perfora.load_dendrites(other, path, replace=True)
    with torch.no_grad():
        assert torch.equal(other.eval()(x), model(x))
