"""Files on disk: atomic writes, the safetensors + JSON checkpoint format, model and
optimizer state, DCP folders, whole-model files and dendrite adapters. No pickle is loaded.

Each module has one job; import from the module that does it (``perfora.checkpoint.format``
reads and writes checkpoint files, ``perfora.checkpoint.files`` writes atomically, ...).
"""

from .adapter import load_dendrites, save_dendrites
from .format import Checkpoint, load_checkpoint, save_checkpoint
from .model import load_model, save_model

__all__ = ["Checkpoint", "load_checkpoint", "load_dendrites", "load_model", "save_checkpoint",
           "save_dendrites", "save_model"]
