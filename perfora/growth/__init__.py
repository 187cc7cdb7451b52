"""Growth: the controller and its parts (policy, state, optimizer slot, surgery, files)."""

from .controller import GrowthController
from .state import Action, BestSnapshot, ControllerState, Decision

__all__ = ["Action", "BestSnapshot", "ControllerState", "Decision", "GrowthController"]
