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

import contextlib
import logging
import os
import re
import sys
import warnings
import weakref
from collections.abc import Iterable
from types import CodeType

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


class HookRecompiles:
    """Makes compiled module code be made again when a recorder hooks modules it runs.

    Dynamo does not guard on a module's empty hook dicts (``torch._dynamo.config.
    skip_nnmodule_hook_guards``, on by default), so code compiled before a recorder's forward
    hooks went on keeps running without them: nothing is recorded. :meth:`armed` therefore
    drops the compiled code of module calls (a ``torch.compile(model)``'s frame, each
    compiled ``forward`` and the frames dynamo resumed them in after a graph break) so that
    their next call compiles with the hooks in. Other compiled modules in the process compile
    once more too. It does so only when some of that code was compiled while the hooks were
    off: re-arming the same modules after an epoch that compiled only with them on drops
    nothing. A compiled function that is not a module's forward keeps its code (it may not
    call the model): it gets a warning, once. Nothing happens without ``torch._dynamo``
    imported or with that setting off (dynamo then recompiles by itself)."""

    def __init__(self) -> None:
        self._modules: tuple[int, ...] = ()
        self._clean: weakref.WeakSet = weakref.WeakSet()  # guards of code made while hooked

    def __reduce__(self) -> tuple:
        return (HookRecompiles, ())  # a copy knows nothing: its first arming drops the code

    def __deepcopy__(self, memo: dict) -> HookRecompiles:
        return HookRecompiles()

    def armed(self, modules: Iterable[object]) -> None:
        """The recorder's hooks are on ``modules`` now."""
        found = _compiled_frames()
        if found is None:
            return
        frames, functions = found
        if functions:
            _warn_once(
                f"perfora: the error-signal hooks perfora adds to the model's layers (in the "
                f"epoch before a growth step may come) do not run in code torch.compile made "
                f"before, and compiled functions ({', '.join(sorted(functions))}) keep theirs. "
                f"If one of them runs the model, nothing is recorded there: dendrites take the "
                f"default initialisation and new neurons random rows (the step's reason says "
                f"'random'). Compile the model itself (torch.compile(model) or model.compile()),"
                f" or set torch._dynamo.config.skip_nnmodule_hook_guards = False before "
                f"compiling")
        hooked = tuple(sorted({id(m) for m in modules}))
        stale = hooked != self._modules or any(
            entry.guard_manager not in self._clean for _, entries in frames for entry in entries)
        self._modules, self._clean = hooked, weakref.WeakSet()
        if stale:
            dynamo = sys.modules["torch._dynamo"]
            with getattr(dynamo.convert_frame, "compile_lock", contextlib.nullcontext()):
                for code, entries in frames:
                    if entries:
                        dynamo.reset_code(code)

    def disarmed(self) -> None:
        """The hooks are off: the code compiled since :meth:`armed` ran with them."""
        found = _compiled_frames()
        for _, entries in found[0] if found is not None else ():
            for entry in entries:
                self._clean.add(entry.guard_manager)


_MODULE_FRAME = re.compile(r"(torch_dynamo_resume_in_)?(forward|inner|_call_impl|"
                           r"_wrapped_call_impl)(_at_\d+)?")


def _compiled_frames() -> tuple[list[tuple[CodeType, list]], set[str]] | None:
    """(code, cache entries) of each module-call frame dynamo compiled (and of the frames it
    resumed them in), and the names of other compiled functions outside torch and perfora;
    None without dynamo, with hook guards on, or in a torch whose internals this does not know
    (then, if anything was compiled, it warns once)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None or not getattr(dynamo.config, "skip_nnmodule_hook_guards", True):
        return None
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo import convert_frame, external_utils
        seen = convert_frame.input_codes.seen
        wrapper = external_utils.wrap_inline(len).__code__
        dynamo.reset_code  # noqa: B018 - present in every torch this knows
    except (ImportError, AttributeError):
        stats = getattr(getattr(dynamo, "utils", None), "counters", {}).get("stats", {})
        if stats.get("unique_graphs", 0):  # something was compiled
            _warn_once(
                "perfora: this torch's dynamo lacks what perfora uses to recompile a compiled "
                "model after its error-signal hooks go on; under torch.compile they may not "
                "run (dendrites then take the default initialisation and new neurons random "
                "rows). Set torch._dynamo.config.skip_nnmodule_hook_guards = False before "
                "compiling to have them run")
        return None
    inside = (os.path.dirname(os.path.dirname(dynamo.__file__)),  # torch, and perfora
              os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (its hooks)
    frames, functions = [], set()
    for ref in list(seen):
        code = ref()
        if code is None:
            continue
        if code is wrapper or _MODULE_FRAME.fullmatch(code.co_name):
            frames.append((code, list(_debug_get_cache_entry_list(code))))
        elif not code.co_filename.startswith(inside) and _debug_get_cache_entry_list(code):
            functions.add(code.co_name)
    return frames, functions


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)
