"""The script server the integration tests start scripts with: each rank its own process
with torchrun's variables, exit codes as a script's, timeouts, and no stale outcomes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.script_server import ScriptServer

SCRIPT = """
import json, os, sys, time
if sys.argv[1] == "sleep":
    time.sleep(float(sys.argv[2]))
if sys.argv[1] == "fail":
    raise RuntimeError("deliberate")
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "KEEP", "DROP")
print(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                  "env": {n: os.environ.get(n) for n in names}}))
"""


@pytest.fixture(scope="module")
def server() -> ScriptServer:
    with ScriptServer(["json"], env={"DROP": "server"}) as made:
        yield made


def _printed(run, rank: int) -> dict:
    return json.loads(run.log(rank).strip().splitlines()[-1])


def test_each_rank_is_its_own_process_with_torchruns_variables(server, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SCRIPT)
    run = server.run(script, "show", cwd=tmp_path / "job", ranks=2, env={"KEEP": "1"},
                     unset=("DROP",))
    assert run.ok and run.codes == [0, 0]
    ranks = [_printed(run, r) for r in range(2)]
    assert ranks[0]["pid"] != ranks[1]["pid"] != os.getpid()
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert {r["env"]["WORLD_SIZE"] for r in ranks} == {"2"}
    assert ranks[0]["env"]["MASTER_PORT"] == ranks[1]["env"]["MASTER_PORT"]
    assert all(r["env"]["KEEP"] == "1" and r["env"]["DROP"] is None for r in ranks)
    assert ranks[0]["cwd"] == str(tmp_path / "job") and ranks[0]["argv"] == ["show"]
    single = server.run(script, "show", cwd=tmp_path / "one")  # one rank: no torchrun env
    assert _printed(single, 0)["env"]["RANK"] is None
    assert _printed(single, 0)["env"]["DROP"] == "server"


def test_a_crash_or_exit_message_is_exit_code_1_with_its_text_and_a_timeout_kills(server, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SCRIPT)
    failed = server.run(script, "fail", cwd=tmp_path / "fail")
    assert failed.codes == [1] and "RuntimeError: deliberate" in failed.log()
    # sys.exit(message) prints the message and exits 1, sys.exit(N) exits N, as in python
    message = server.run(script, "exit", "unknown model 'x'", cwd=tmp_path / "message")
    assert message.codes == [1] and message.log().strip() == "unknown model 'x'"
    assert server.run(script, "exit", "2", cwd=tmp_path / "two").codes == [2]
    slow = server.run(script, "sleep", "30", cwd=tmp_path / "slow", ranks=2, timeout=1)
    assert slow.codes == [-9, -9] and not slow.ok


def test_an_interrupted_wait_leaves_no_outcome_for_the_next_job(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SCRIPT)

    def interrupt(*_: object) -> None:
        raise TimeoutError("a test's timeout")

    with ScriptServer(["json"]) as fresh:
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.alarm(1)
            with pytest.raises(TimeoutError):
                fresh.run(script, "sleep", "30", cwd=tmp_path / "abandoned")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        after = fresh.run(script, "show", cwd=tmp_path / "next")
        assert after.ok and _printed(after, 0)["argv"] == ["show"]
        assert Path(after.cwd) == tmp_path / "next"


def test_a_module_runs_as_python_dash_m_with_the_folder_on_the_path(server, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "local_tool.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n")
    run = server.run("-m local_tool", "a", "b", cwd=job)  # importable from the cwd only
    assert run.codes == [0]
    assert run.log().split() == ["__main__", "['a',", "'b']", str(job)]
