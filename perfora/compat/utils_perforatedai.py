"""``from perfora.compat import utils_perforatedai as UPA``: model conversion, save and load."""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import nn

from ..checkpoint.model import load_model, save_model
from ..distributed.collectives import is_rank_zero
from ..errors import ConfigError, OrderError, PerforationError
from ..nn.layers import unwrap_model
from ..nn.perforation import perforate
from . import globals_perforatedai as GPA
from .module_selection import perforate_kwargs
from .names import missing_name_hook


def perforate_model(model: nn.Module, doing_pai: bool = True, save_name: str = "",
                    making_graphs: bool = True, maximizing_score: bool | None = None,
                    num_classes: float = 1e10, values_per_train_epoch: int = -1,
                    values_per_val_epoch: int = -1, zooming_graph: bool = True,
                    config_file: str | None = None) -> nn.Module:
    """Wrap the modules GPA.pc selects in place, attach GPA.pai_tracker, return the model.

    ``save_name`` is the run folder (default GPA.pc's, 'PAI'); ``maximizing_score=None``
    keeps GPA.pc's; ``doing_pai=False`` is the no-dendrite early-stopping baseline. The
    graph options are accepted (perfora always writes metrics.csv and history.png).
    """
    if config_file is not None:
        raise ConfigError("perforate_model(config_file=...) is not supported: set the values "
                          "with GPA.pc.set_<name>(value) in the script")
    GPA.pc.mark_perforated(False)  # a new run: its settings apply from here
    if save_name:
        GPA.pc.set("save_name", str(save_name))
    if maximizing_score is not None:
        GPA.pc.set("maximizing_score", bool(maximizing_score))
    if (doing_pai and GPA.pc.get("testing_dendrite_capacity")
            and GPA.pc.get("max_dendrites") != 0 and not GPA.pc.get("silent")):
        warnings.warn("GPA.pc testing_dendrite_capacity is True (the PerforatedAI default): "
                      "this is a smoke test that adds a dendrite set every epoch and stops "
                      "after 3. Call GPA.pc.set_testing_dendrite_capacity(False) for a real "
                      "run", stacklevel=2)
    try:
        perforate(model, **perforate_kwargs(model, GPA.pc))
    except PerforationError as exc:
        if "running statistics" in str(exc):
            raise PerforationError(
                f"{exc}. Under the PerforatedAI names: take the class out of "
                "GPA.module_names_to_convert (GPA.pc.set_module_names_to_perforate); the "
                "Conv and Linear layers inside it are wrapped by default") from exc
        if "neuron_axes" not in str(exc) and "num_neurons" not in str(exc):
            raise
        raise PerforationError(
            f"{exc}. perforate_model has neither argument (GPA.pc.set_output_dimensions is "
            "not read): wrap such modules first with perfora.perforate(model, "
            "names=('<class>',), neuron_axes={'<class>': AXIS}, example_input=<one batch>); "
            "UPA.perforate_model then keeps them and wraps the rest") from exc
    GPA.pc.mark_perforated(True)
    GPA.pai_tracker.attach(model, GPA.pc.get("save_name") or "PAI", doing_pai=doing_pai)
    return model


def initialize_pai(model: nn.Module, doing_pai: bool = True, save_name: str = "PAI",
                   making_graphs: bool = True, maximizing_score: bool = True,
                   num_classes: float = 1e10, values_per_train_epoch: int = -1,
                   values_per_val_epoch: int = -1, zooming_graph: bool = True) -> nn.Module:
    """The older name of :func:`perforate_model`."""
    return perforate_model(model, doing_pai=doing_pai, save_name=save_name,
                           making_graphs=making_graphs, maximizing_score=maximizing_score)


def _file(folder: str | Path, name: str) -> Path:
    name = str(name)
    return Path(folder) / (name if name.endswith(".pt") else f"{name}.pt")


def _attached(model: nn.Module) -> bool:
    ctl = GPA.pai_tracker.controller
    return ctl is not None and unwrap_model(ctl.model) is unwrap_model(model)


def save_system(model: nn.Module, folder: str | Path, name: str) -> Path:
    """Write ``folder/name.pt`` (rank 0): model, structure and, when GPA.pai_tracker runs
    this model, the tracker state (safetensors + JSON; never pickle)."""
    path = _file(folder, name)
    if is_rank_zero():
        if _attached(model):
            GPA.pai_tracker.controller.save(path)
        else:
            save_model(path, model)
    return path


def load_system(model: nn.Module, folder: str | Path, name: str,
                load_from_restart: bool = False, switch_call: bool = False,
                load_from_manual_save: bool = False) -> nn.Module:
    """Load ``folder/name.pt`` into ``model``: structure (dendrites), weights and, for the
    model GPA.pai_tracker runs, the tracker state. Call it before setup_optimizer."""
    path = _file(folder, name)
    if _attached(model):
        ctl = GPA.pai_tracker.controller
        if ctl.optimizer is not None:
            warnings.warn("UPA.load_system after setup_optimizer: the optimizer you hold "
                          "no longer matches the loaded model; call setup_optimizer again "
                          "(or load before creating it, as the PerforatedAI recipe does)",
                          stacklevel=2)
        ctl.load(path)
        if ctl.config.maximize != GPA.pc.get("maximizing_score"):  # the saved run's direction
            GPA.pc.set("maximizing_score", ctl.config.maximize)
        return model
    if load_from_restart:
        raise OrderError(f"load_system({str(folder)!r}, {name!r}, True) restores the tracker, "
                         "so it needs the model given to UPA.perforate_model: call "
                         "model = UPA.perforate_model(model, ...) first, then load_system")
    return load_model(model, path)


def count_params(model: nn.Module) -> int:
    """Number of parameters (each tensor once): what the deployed model holds."""
    return sum(p.numel() for p in unwrap_model(model).parameters())


__all__ = ["perforate_model", "initialize_pai", "save_system", "load_system", "count_params"]

__getattr__ = missing_name_hook(__name__, __all__, {
    "initializePB": "use UPA.perforate_model (the current name)",
    "prepare_final_model": "perfora's model is already the deployable model; save it with "
                           "perfora.save_model and load it with perfora.load_model",
    "convert_network": "use UPA.perforate_model (or perfora.perforate)",
    "simulate_cycles": "UPA.load_system rebuilds the dendrites from the checkpoint itself",
    "load_pretrained_model": "use perfora.load_model(model, path) for weights and structure",
    "pai_save_system": "use UPA.save_system",
    "upload_to_huggingface": "save with perfora.save_model and upload the file yourself",
    "from_hf_pretrained": "download the file and load it with perfora.load_model",
})
