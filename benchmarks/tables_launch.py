"""benchmarks/README.md's tables of the restart benchmarks (see tables.py): ``multinode.py``
and ``launch_restart.py``, from the stored JSON."""

from __future__ import annotations

from collections.abc import Callable

from tables_quality import _load, _rows


def table_multinode() -> str:
    """``multinode.py``: one restructure in-process against a torchrun restart, 2 nodes."""
    out = []
    for r in _load("multinode.json")["rows"]:
        out.append([str(r["ranks"]), f"{r['median_restructure_ms_error']:.0f}",
                    f"{r['median_restructure_ms_default']:.1f}", f"{r['median_restart_ms']:.0f}",
                    f"{r['restart_over_error']:.1f}x", f"{r['restart_over_default']:.0f}x"])
    return _rows(["ranks", "in-process ms (error init)", "in-process ms (random init)",
                  "restart ms", "restart / error init", "restart / random init"], out)


def table_launch_restart() -> str:
    """``launch_restart.py``: a `perfora launch` of a few attempts, agent forked or fresh."""
    result = _load("launch_restart.json")
    out = []
    for r in result["rows"]:
        out.append([r["arm"], f"{r['launches']}", f"{r['median_s']:.2f}",
                    f"{r['min_s']:.2f}-{r['max_s']:.2f}", f"{r['per_attempt_s']:.2f}",
                    f"{r['fresh_over_forked']:.2f}x"])
    return _rows(["torchrun agent", "launches", f"median s ({result['attempts']} attempts)",
                  "range s", "s per attempt", "fresh / forked"], out)


TABLES: dict[str, Callable[[], str]] = {
    "multinode": table_multinode,
    "launch-restart": table_launch_restart,
}
