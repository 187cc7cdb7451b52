"""perfora: grow PyTorch models during training by adding artificial dendrites.

The Lightning callback lives in :mod:`perfora.integrations.lightning` (optional dependency:
``pip install "perfora[lightning]"``); ``perfora.compat`` holds the PerforatedAI names.
"""

from typing import TYPE_CHECKING, Any  # noqa: E402

from ._version import __version__
from .checkpoint.adapter import load_dendrites, save_dendrites  # noqa: E402
from .checkpoint.format import load_checkpoint  # noqa: E402
from .checkpoint.model import load_model, save_model  # noqa: E402
from .config import PerforaConfig  # noqa: E402
from .errors import (
    CheckpointError,
    ConfigError,
    ConversionError,
    ExportError,
    OrderError,
    ParallelError,
    PerforaError,
    PerforationError,
    ScoreError,
    ShapeMismatchError,
)
from .growth import ControllerState, Decision, GrowthController  # noqa: E402
from .growth.candidates import GrowthPlan, plan_growth  # noqa: E402
from .growth.restart import mark_training_complete  # noqa: E402
from .growth.resume import resume  # noqa: E402
from .growth.signal import ErrorSignalProbe  # noqa: E402
from .nn.consumers import LayerPlan, WideningPlan, plan_widening  # noqa: E402
from .nn.export import export  # noqa: E402
from .nn.layers import DendriticLayer, dendritic_layers, unwrap_model  # noqa: E402
from .nn.perforation import ConversionReport, describe, perforate  # noqa: E402
from .nn.widening import gradmax_init, widen  # noqa: E402
from .rules import LearningRule, RuleStep, register_rule  # noqa: E402

__all__ = [
    "ErrorSignalProbe", "GrowthPlan", "plan_growth",
    "__version__", "PerforaConfig", "GrowthController", "Decision", "ControllerState",
    "perforate", "describe", "resume", "ConversionReport", "DendriticLayer", "dendritic_layers",
    "unwrap_model", "save_model", "load_model", "load_checkpoint", "export",
    "save_dendrites", "load_dendrites", "LearningRule",
    "RuleStep",
    "register_rule", "PerforaError", "ConfigError", "ScoreError", "OrderError",
    "ConversionError", "CheckpointError", "ShapeMismatchError", "PerforationError",
    "ParallelError", "ExportError", "mark_training_complete",
    "plan_widening", "widen", "gradmax_init", "WideningPlan", "LayerPlan",
]

from . import distributed  # noqa: E402
from .distributed import RankMismatchError, set_epoch
from .parallel import shard_fsdp2, wrap_ddp, wrap_deepspeed, wrap_fsdp1

__all__ += ["distributed", "RankMismatchError", "wrap_ddp", "shard_fsdp2", "wrap_fsdp1",
            "wrap_deepspeed", "set_epoch"]


if TYPE_CHECKING:  # pragma: no cover
    from .codemod import CodemodResult


def convert_source(source: str, mode: str = "native", **options: Any) -> "CodemodResult":
    """Apply the seed's edits to a training script's text; see perfora.codemod (needs libcst).

    Returns a :class:`perfora.codemod.CodemodResult` (``output``, ``findings``, ``diff()``);
    imported lazily so that ``import perfora`` works without libcst.
    """
    from .codemod import convert_source as _convert

    return _convert(source, mode, **options)


__all__ += ["convert_source"]
