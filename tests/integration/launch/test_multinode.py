"""Two real nodes on one machine: two network namespaces joined by a veth pair, torchrun on
each (2 ranks per node, 4 in all), static and c10d rendezvous on the first node's address.

Needs root and iproute2 (CI runs as root); elsewhere the tests are skipped with the reason.
The namespaces and the veth pair are always removed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfora.growth.restart import ATTEMPT_ENV, COMPLETE_MARKER, LOAD_FLAG
from tests.support.paths import ROOT, SCRIPTS
from tests.support.script_server import ScriptServer

sys.path.insert(0, str(ROOT / "benchmarks"))
from netns import NamespacesUnavailable, Nodes, two_nodes  # noqa: E402

GROW = SCRIPTS / "multinode" / "ddp_grow.py"
NATIVE = SCRIPTS / "launch" / "native_train.py"


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    try:
        with two_nodes() as made:
            yield made
    except NamespacesUnavailable as exc:
        pytest.skip(str(exc))


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        logs.append(out)
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    return logs


def _torchrun(nodes: Nodes, node: int, rendezvous: str, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
           str(node), "--nproc-per-node", "2", "--max-restarts", "0"]
    if rendezvous == "static":
        return cmd + ["--master-addr", nodes.addrs[0], "--master-port", str(port)]
    # c10d: the first node hosts the store; every node gives its own address, since the
    # namespaces share the machine's host name, which resolves outside them
    return cmd + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{nodes.addrs[0]}:{port}",
                  "--rdzv-id", "perfora-test", "--rdzv-conf", f"is_host={int(node == 0)}",
                  "--local-addr", nodes.addrs[node]]


def _results(out: Path) -> list[dict]:
    return [json.loads((out / f"result_{rank}.json").read_text()) for rank in range(4)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rendezvous,sharding", [("static", "ddp"), ("c10d", "fsdp2")])
def test_in_process_growth_on_two_nodes(nodes, tmp_path, rendezvous, sharding):
    out = tmp_path / "out"
    extra = ["--fsdp2"] if sharding == "fsdp2" else []
    procs = [nodes.run(i, _torchrun(nodes, i, rendezvous, 29400) + [str(GROW), str(out),
                                                                    *extra], tmp_path)
             for i in range(2)]
    _finish(procs, 180)
    ranks = _results(out)
    assert {r["world"] for r in ranks} == {4}
    assert sorted(r["node"] for r in ranks) == ["0", "0", "1", "1"]
    assert all(r["actions"] == ranks[0]["actions"] for r in ranks)
    assert ranks[0]["actions"].count("restructure") == 2 and ranks[0]["actions"][-1] == "complete"
    assert {r["dendrites"] for r in ranks} == {2}
    assert len({r["digest"] for r in ranks}) == 1  # every parameter, bit for bit, on 4 ranks


def _launch(nodes: Nodes, node: int, run: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "perfora", "launch", "--nnodes", "2", "--node-rank",
            str(node), "--master-addr", nodes.addrs[0], "--master-port", str(port),
            "--nproc-per-node", "1", "--max-failures", "2", "--attempt-timeout", "150",
            str(NATIVE), "--out", str(run / "out"), "--epochs_per_switch", "2",
            "--max_dendrites", "1"]


def _final(run: Path) -> list[dict]:
    return [json.loads((run / "out" / f"params_rank{r}.json").read_text()) for r in range(2)]


def _uninterrupted_reference(server: ScriptServer, run: Path) -> None:
    """The same training, never killed, on 2 ranks on one node: the restart workflow that
    `perfora launch` drives, with the ranks forked from the script server (with 2 ranks
    gloo's sums are the same on any transport, so the reference is bit for bit the run)."""
    for attempt in range(1, 5):
        if (run / "PAI" / COMPLETE_MARKER).exists():
            return
        done = server.run(NATIVE, "--out", run / "out", "--epochs_per_switch", "2",
                          "--max_dendrites", "1", LOAD_FLAG, "PAI", cwd=run, ranks=2,
                          env={ATTEMPT_ENV: str(attempt)}, timeout=120)
        assert done.ok, done.logs[-3000:]
    assert (run / "PAI" / COMPLETE_MARKER).exists(), "the reference did not complete"


@pytest.mark.timeout(500)
def test_rank_killed_on_the_second_node_stops_all_and_launch_resumes(nodes, tmp_path,
                                                                     script_server):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    killed.mkdir()
    # one rank per node (the restart costs are per process): rank 1 (the second node) is
    # SIGKILLed halfway through epoch 2 of the first attempt
    procs = [nodes.run(i, _launch(nodes, i, killed, 29460), killed,
                       {"NATIVE_TRAIN_KILL": "1:2"}) for i in range(2)]
    _uninterrupted_reference(script_server, reference)
    logs = _finish(procs, 300)
    for log in logs:  # every node's first attempt failed, promptly, and was restarted
        failed = [line for line in log.splitlines() if "attempt 1 failed" in line]
        assert failed, log[-3000:]
        seconds = float(failed[0].split(" after ")[1].split(" s")[0])
        assert seconds < 60, failed[0]
    events = [json.loads(line) for line in
              (killed / "out" / "events.jsonl").read_text().splitlines()]
    resumed = next(e for e in events if e["attempt"] == 2 and e["event"] == "start")
    assert resumed["epoch"] >= 1  # at most one epoch lost (epoch 2 was in progress)
    final, expected = _final(killed), _final(reference)
    assert all(f["params"] == final[0]["params"] for f in final)  # both ranks identical
    assert [f["dendrites"] for f in final] == [f["dendrites"] for f in expected]
    assert final[0]["epoch"] == expected[0]["epoch"]
    assert final[0]["params"] == expected[0]["params"]  # the same run, bit for bit
