"""The controller's advice in the PerforatedAI names: a script written for that API has no
``decision`` or ``controller`` to follow, so its warnings and order errors name the
``GPA.pai_tracker`` calls that do the same."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import OrderError
from ..warn import warn_user

# (the native phrase, the same advice under the PerforatedAI names); longest phrases first
PHRASES: tuple[tuple[str, str], ...] = (
    ("train with decision.optimizer (and decision.model)",
     "call GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs) again and train with "
     "the optimizer it returns (and the model add_validation_score returned)"),
    ("use decision.model and decision.optimizer",
     "use the model add_validation_score returned and call GPA.pai_tracker.setup_optimizer "
     "again"),
    ("Register yours first: controller.set_optimizer(torch.optim.Adam, lr=...) (perfora "
     "rebuilds it), or set_optimizer_instance(opt)",
     "Register yours first: GPA.pai_tracker.set_optimizer(torch.optim.Adam), then "
     "optimizer, scheduler = GPA.pai_tracker.setup_optimizer(model, {'lr': ...}), or "
     "GPA.pai_tracker.set_optimizer_instance(opt)"),
    ("step() with no optimizer registered", "add_validation_score with no optimizer registered"),
    ("step() got a", "add_validation_score got a"),
)

def in_compat_terms(text: str) -> str:
    """``text`` with each native phrase replaced by its PerforatedAI-names equivalent."""
    for native, compat in PHRASES:
        text = text.replace(native, compat)
    return text


@contextmanager
def compat_terms() -> Iterator[None]:
    """Warnings and OrderErrors raised inside, re-raised in the PerforatedAI names."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            except OrderError as exc:
                raise OrderError(in_compat_terms(str(exc))) from None
    finally:  # the user's filters are back: they decide what is shown
        for item in caught:
            warn_user(in_compat_terms(str(item.message)), item.category)
