"""Run a script on 2 CPU ranks as torchrun starts them and read each rank's result JSON.

The ranks are forked from the warm script server (script_server.py) with torchrun's
environment, so a job costs its work, not two more imports of transformers or Lightning.
"""

from __future__ import annotations

import json
from pathlib import Path

from .script_server import ScriptServer


def run_two_ranks(server: ScriptServer, script: Path, out: Path, *extra: str,
                  timeout: float = 240) -> list[dict]:
    """``script out *extra`` on 2 ranks; both must exit 0; each rank's result_<rank>.json."""
    run = server.run(script, out, *extra, cwd=out, ranks=2, timeout=timeout)
    assert run.ok, f"exit codes {run.codes}:\n{run.logs[-3000:]}"
    return [json.loads((out / f"result_{rank}.json").read_text()) for rank in range(2)]
