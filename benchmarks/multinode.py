"""One restructure in-process against one torchrun restart, on two nodes (2 and 4 ranks).

Two network namespaces joined by a veth pair stand for two machines (``netns.py``; needs
root). On each, ``torchrun --nnodes 2 --nproc-per-node P`` (static rendezvous on the first
node's address) runs the DDP job of ``ddp.py`` (MLP 64-256x3-10, gloo, one thread per rank):

* in-process: ``controller.step()`` deciding to add dendrites (score agreement over the
  ranks, growth, structure check, new DDP wrapper, new optimizer), timed on every rank from
  a barrier until it returns, three times; the slowest rank's time counts. Twice: with the
  default ``dendrite_init='error'`` (each new dendrite chosen by candidate training on the
  recorded error signal, whose every step averages gradients over the ranks) and with
  ``dendrite_init='default'`` (random weights);
* restart: what the restart workflow pays instead, a fresh ``torchrun`` on both nodes whose
  ranks start, join the process group, load the checkpoint written after the restructure,
  wrap DDP and meet at a barrier, timed from launch until both nodes' torchrun exit.

    python benchmarks/multinode.py [--restarts 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import output_paths

HERE = Path(__file__).resolve().parent
OUTPUT = "multinode.json"
PER_NODE = (1, 2)
INITS = ("error", "default")
TIMEOUT_S = 240


def _rank_inprocess(out: Path, init: str) -> None:
    """Three timed in-process restructures; rank 0 saves the checkpoint a restart loads."""
    import torch
    import torch.distributed as dist
    from ddp import BATCH, IN, OUT, make_mlp

    import perfora

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = perfora.wrap_ddp(perfora.perforate(make_mlp()))
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=4,
                                   retain_all_dendrites=True, dendrite_init=init)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(BATCH, IN, generator=gen), torch.randint(0, OUT, (BATCH,), generator=gen)
    times = []
    for _ in range(3):
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        dist.barrier()
        start = time.perf_counter()
        decision = ctl.step(1.0, model=model)
        times.append(1000 * (time.perf_counter() - start))
        model, opt = decision.model, decision.optimizer
    ctl.save(out / "restart.safetensors")  # replicated model: rank 0 writes
    (out / f"inprocess_{init}_{rank}.json").write_text(json.dumps(
        {"restructure_ms": times, "world": dist.get_world_size(),
         "dendrites": ctl.num_dendrites}))
    dist.barrier()
    dist.destroy_process_group()


def _rank_restart(out: Path) -> None:
    """What a restarted worker does before it can train again."""
    import torch
    import torch.distributed as dist
    from ddp import make_mlp

    import perfora

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    ctl = perfora.GrowthController(perfora.perforate(make_mlp()), switch_mode="every_epoch",
                                   max_dendrites=4)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01)
    decision = ctl.load(out / "restart.safetensors")
    perfora.wrap_ddp(decision.model)
    dist.barrier()
    dist.destroy_process_group()


def _torchrun(nodes, node: int, per_node: int, port: int, job: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(node), "--nproc-per-node", str(per_node), "--max-restarts", "0",
            "--master-addr", nodes.addrs[0], "--master-port", str(port), __file__,
            "--rank-job", *job.split(":"), "--out", str(out)]


def _run_both(nodes, per_node: int, port: int, job: str, out: Path) -> float:
    """Start the job on both nodes; seconds until both torchrun exited (0 on success)."""
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    procs = [nodes.run(i, _torchrun(nodes, i, per_node, port, job, out), out, env)
             for i in range(2)]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
        except Exception:
            for p in procs:
                p.kill()
            raise
    seconds = time.perf_counter() - start
    for proc, log in zip(procs, logs):
        if proc.returncode != 0:
            raise SystemExit(f"{job} on {2 * per_node} ranks failed:\n{log[-3000:]}")
    return seconds


def measure(nodes, per_node: int, restarts: int, port: int) -> dict:
    """In-process restructure times (both inits) and restart times on 2 x ``per_node``."""
    row: dict = {"ranks": 2 * per_node}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for offset, init in enumerate(INITS):
            _run_both(nodes, per_node, port + offset, f"inprocess:{init}", out)
            ranks = [json.loads((out / f"inprocess_{init}_{r}.json").read_text())
                     for r in range(2 * per_node)]
            slowest = [max(r["restructure_ms"][i] for r in ranks) for i in range(3)]
            row[f"restructure_ms_{init}"] = slowest
            row[f"median_restructure_ms_{init}"] = statistics.median(slowest)
        restart_s = [_run_both(nodes, per_node, port + len(INITS) + i, "restart", out)
                     for i in range(restarts)]
    row["restart_s"] = restart_s
    row["median_restart_ms"] = 1000 * statistics.median(restart_s)
    for init in INITS:
        row[f"restart_over_{init}"] = row["median_restart_ms"] / \
            row[f"median_restructure_ms_{init}"]
    return row


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--restarts", type=int, default=3, help="restarts to time per size")
    output_paths.add_output_options(ap, OUTPUT, "--json")
    ap.add_argument("--rank-job", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    from netns import NamespacesUnavailable, two_nodes

    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rank_job:
        if args.rank_job[0] == "inprocess":
            _rank_inprocess(args.out, args.rank_job[1])
        else:
            _rank_restart(args.out)
        return 0
    if args.restarts < 1:
        ap.error("--restarts must be at least 1")
    rows = []
    try:
        with two_nodes() as nodes:
            for per_node in PER_NODE:
                print(f"{2 * per_node} ranks over 2 nodes ...", flush=True)
                rows.append(measure(nodes, per_node, args.restarts, 29500 + 10 * per_node))
    except NamespacesUnavailable as exc:
        raise SystemExit(f"cannot run: {exc}") from exc
    print(f"{'ranks':>5} {'in-process ms, error init':>26} {'in-process ms, random init':>27} "
          f"{'restart ms':>11} {'restart / in-process':>22}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['median_restructure_ms_error']:>26.0f} "
              f"{r['median_restructure_ms_default']:>27.1f} {r['median_restart_ms']:>11.0f} "
              f"{r['restart_over_error']:>9.1f}x / {r['restart_over_default']:>6.0f}x")
    import torch

    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "multinode", "nodes": 2, "rows": rows,
                                     "torch": torch.__version__,
                                     "machine": platform.machine(),
                                     "cpus": os.cpu_count(),
                                     "load_avg_after": os.getloadavg()}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
