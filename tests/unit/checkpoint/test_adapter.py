"""Dendrites as an adapter: a small file with only what growth added, applied to a fresh
base model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora


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
