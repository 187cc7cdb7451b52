"""``benchmarks/launch_restart.py``'s summary: medians of the launches that completed, per
attempt, the fresh/forked ratio, and failed launches counted, never timed; and the result
file every benchmark writes through ``output_paths.write_result``."""

from __future__ import annotations

import math
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from launch_restart import main, summarize  # noqa: E402


def _run(arm: str, seconds: float, completed: bool = True) -> dict:
    return {"arm": arm, "seconds": seconds, "completed": completed}


def test_the_summary_takes_medians_of_completed_launches_and_their_ratio():
    runs = [_run("forked", 12.0), _run("fresh", 18.0), _run("fresh", 20.0),
            _run("forked", 10.0), _run("forked", 11.0), _run("fresh", 19.0),
            _run("fresh", 1.0, completed=False)]
    forked, fresh = summarize(runs, attempts=3)
    assert (forked["arm"], forked["launches"], forked["failed"]) == ("forked", 3, 0)
    assert (fresh["launches"], fresh["failed"]) == (3, 1)  # the failed one is not timed
    assert forked["median_s"] == 11.0 and fresh["median_s"] == 19.0
    assert forked["per_attempt_s"] == pytest.approx(11.0 / 3, abs=0.01)
    assert (forked["min_s"], forked["max_s"], fresh["min_s"]) == (10.0, 12.0, 18.0)
    assert forked["fresh_over_forked"] == fresh["fresh_over_forked"] == pytest.approx(19 / 11,
                                                                                     abs=0.01)


def test_an_arm_without_a_completed_launch_has_no_median():
    _, fresh = summarize([_run("forked", 10.0), _run("fresh", 5.0, completed=False)], 2)
    assert fresh["launches"] == 0 and math.isnan(fresh["median_s"])


@pytest.mark.parametrize("args,said", [(["--reps", "0"], "at least 1"),
                                       (["--attempts", "0"], "at least 1"),
                                       (["--timeout-s", "0"], "positive number of seconds"),
                                       (["--timeout-s", "nan"], "positive number of seconds")])
def test_nonpositive_counts_and_timeouts_are_refused(args, said, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_the_result_file_holds_the_fields_and_the_run_facts(tmp_path, capsys):
    import json
    import time

    import torch
    from output_paths import write_result

    path = tmp_path / "deeper" / "launch_restart.json"  # its folder is made
    write_result(path, "launch_restart", ["--reps", "2"], time.monotonic() - 3.0,
                 {"rows": [{"arm": "forked"}], "reps": 2})
    saved = json.loads(path.read_text())
    assert saved["benchmark"] == "launch_restart" and saved["reps"] == 2
    assert saved["command"] == "python benchmarks/launch_restart.py --reps 2"
    assert saved["rows"] == [{"arm": "forked"}] and saved["seconds"] >= 3.0
    assert saved["torch"] == torch.__version__ and len(saved["load_avg_after"]) == 3
    assert f"wrote {path}" in capsys.readouterr().out
