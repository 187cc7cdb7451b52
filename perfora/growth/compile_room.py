"""Room in ``torch.compile``'s cache for the graphs each dendrite count needs.

A compiled model recompiles after every restructure: its parameters have new shapes and the
dendrite count is a Python int the graph unrolls. With the usual loop (train with gradients,
evaluate under ``torch.no_grad()``) each dendrite count needs two graphs, because dynamo
keeps one graph per grad mode. Dynamo keeps at most ``torch._dynamo.config.recompile_limit``
(8) graphs per compiled frame and past that runs the model eagerly, with only a log line to
say so: 2 graphs for the first structure and 2 per restructure reach it at the fourth
restructure. So after each restructure the limit is raised, if needed, to leave the same room
as the default leaves a model that never grows (8 - 2 = 6 graphs) on top of the graphs the
dendrite counts so far need. Dynamo is never imported here: a run that does not compile
pays nothing and sees no change.
"""

from __future__ import annotations

import logging
import sys

GRAPHS_PER_STRUCTURE = 2  # one with gradients (training), one without (evaluation)
_DEFAULT_LIMIT = 8

log = logging.getLogger(__name__)


def make_room_for_recompiles(structures: int) -> None:
    """Raise dynamo's recompile limit to fit ``structures`` dendrite counts (never lower it)."""
    dynamo = sys.modules.get("torch._dynamo")
    config = getattr(dynamo, "config", None)
    current = getattr(config, "recompile_limit", None)
    if not isinstance(current, int):
        return
    needed = _DEFAULT_LIMIT + GRAPHS_PER_STRUCTURE * (structures - 1)
    if needed > current:
        log.info("perfora: torch._dynamo.config.recompile_limit %d -> %d, so a compiled model "
                 "keeps compiling for its %d dendrite counts", current, needed, structures)
        config.recompile_limit = needed
