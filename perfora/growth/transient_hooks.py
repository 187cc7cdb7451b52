"""Forward hooks that belong to one run's recorders, not to the model: a ``deepcopy`` or a
pickle of the model (``torch.save(model)``, an EMA copy, a spawned DataLoader worker) gets a
hook that removes itself at its first call instead of one that feeds, or carries, the
original's recorded rows (a closure hook also made the model unpicklable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

Hook = Callable[[nn.Module, tuple, Any], None]


class TransientHook:
    """Calls ``fn``; copied or pickled, it becomes a :class:`_Removed`."""

    def __init__(self, fn: Hook) -> None:
        self.fn = fn

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.fn(module, args, output)

    def __reduce__(self) -> tuple:
        return (_Removed, ())

    def __deepcopy__(self, memo: dict) -> _Removed:
        return _Removed()


class _Removed:
    """What a copy of a :class:`TransientHook` is: it takes itself off the module when first
    called, and does nothing."""

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        for key, hook in list(module._forward_hooks.items()):
            if hook is self:
                del module._forward_hooks[key]
                module._forward_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)
