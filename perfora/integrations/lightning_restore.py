"""Lightning ``ckpt_path=`` loads of a checkpoint taken at another structure than the model's.

Before a checkpoint's weights load, the model takes the dendrites and neuron widths saved
with them: a best checkpoint from before a growth step then loads into the grown model, and
any checkpoint into a freshly built one. Unsharded strategies reshape the model in place just
before Lightning loads the state dict; sharded ones (FSDP2 through ``ModelParallelStrategy``,
FSDP1, DeepSpeed) load inside ``strategy.load_checkpoint``, so the model is reshaped there,
re-sharded the way it was sharded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..growth import surgery
from ..growth.state import ControllerState
from ..nn.perforation import fit_structure, layer_specs
from ..parallel.factory import backend_of
from .lightning_support import callback_entry

_MARK = "perfora_structure_first"


def checkpoint_structure(callbacks: Mapping[str, Any] | None, key: str,
                         module_path: str | None) -> dict[str, Any] | None:
    """The structure a DendriteGrowth callback saved among a checkpoint's callbacks (None
    when it saved none); ConfigError when that callback grew another module."""
    saved = callback_entry(callbacks or {}, key)
    structure = (saved or {}).get("structure")
    if structure is not None and module_path is not None \
            and saved.get("module", module_path) != module_path:
        raise ConfigError(f"the checkpoint grew module {saved.get('module')!r}, this "
                          f"DendriteGrowth(module={module_path!r}); pass the same module=")
    return structure


def reshape_in_place(target: nn.Module, structure: Mapping[str, Any]) -> None:
    """Give an unsharded ``target`` the saved structure (nothing when it has it already)."""
    if layer_specs(target) != structure:
        fit_structure(target, structure, "the checkpoint's dendrite structure")


def reshaped(target: nn.Module, structure: Mapping[str, Any]) -> nn.Module:
    """``target`` with the saved structure, sharded as it was: a sharded model is gathered,
    reshaped and sharded again (a collective on every rank), an unsharded one is reshaped in
    place. No growth controller is involved: a fit's growth run stays as it was."""
    backend = backend_of(target)
    model = surgery.match_structure(target, backend, ControllerState(), structure)
    return backend.rewrap(model)


def is_installed(method: Any) -> bool:
    """True when ``method`` is already one of the wrappers below (a Trainer's earlier stage)."""
    return bool(getattr(method, _MARK, False))


def mark_installed(method: Any) -> Any:
    """Mark a wrapper so that a later stage of the same Trainer does not wrap it again."""
    setattr(method, _MARK, True)
    return method
