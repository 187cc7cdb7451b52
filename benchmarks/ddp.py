"""DDP step time with dendrites, and the cost of one restructure: in-process vs restart.

Two CPU ranks on gloo (spawned processes, a FileStore), one thread each, the same MLP and
the same per-rank data for every variant:

- ``plain``: the unconverted model under DDP.
- ``perfora K=0/1/2``: the perforated model with K dendrite sets, wrapped the way perfora
  re-wraps it (``find_unused_parameters=False``).
- ``find_unused K=1/2``: the same perforated models under ``find_unused_parameters=True``,
  as the PerforatedAI multi-GPU recipe requires.

Variants are timed interleaved (every round runs each variant for a few steps, in rotated
order); a variant's time is the median over rounds of its per-step time, and its ratio the
median over rounds of ``t(variant) / t(plain)`` from the same round.

Then the wall time of one restructure: ``controller.step()`` deciding to add dendrites under
DDP (score agreement, growth, structure check, new DDP, new optimizer), against one restart
of the restart workflow: a fresh ``torchrun --standalone --nproc_per_node 2`` that starts,
imports torch, joins the process group, builds the model, loads the checkpoint written at
the restructure and wraps DDP (measured until both ranks are ready to train).

    python benchmarks/ddp.py                      # about 1-2 minutes on 2 cores
    python benchmarks/ddp.py --quick              # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import output_paths
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora

WORLD = 2
OUTPUT = "ddp.json"
WIDTH, DEPTH, BATCH, IN, OUT = 256, 3, 32, 64, 10


def make_mlp(seed: int = 0) -> nn.Module:
    """MLP 64-256x3-10."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = IN
    for _ in range(DEPTH):
        layers += [nn.Linear(width, WIDTH), nn.ReLU()]
        width = WIDTH
    layers.append(nn.Linear(width, OUT))
    return nn.Sequential(*layers)


def perforated(k: int) -> nn.Module:
    model = perfora.perforate(make_mlp())
    for i in range(k):
        for j, layer in enumerate(perfora.dendritic_layers(model).values()):
            layer.grow(torch.Generator().manual_seed(100 * i + j))
    return model


def _steps(model: nn.Module, opt: torch.optim.Optimizer, data, n: int) -> float:
    start = time.perf_counter()
    for x, y in data[:n]:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / n


def _worker(rank: int, tmp: str, rounds: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g))
            for _ in range(steps)]
    variants: dict[str, nn.Module] = {"plain": DDP(make_mlp())}
    for k in (0, 1, 2):
        variants[f"perfora K={k}"] = perfora.wrap_ddp(perforated(k))
    for k in (1, 2):
        variants[f"find_unused K={k}"] = DDP(perforated(k), find_unused_parameters=True)
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in variants.items()}
    names = list(variants)
    for name in names:  # warm-up (first iterations build DDP's buckets)
        _steps(variants[name], opts[name], data, min(3, steps))
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            times[name].append(_steps(variants[name], opts[name], data, steps))
    del variants, opts

    # one in-process restructure, timed from step() to the new wrapper and optimizer
    restructure_ms = []
    model = perfora.wrap_ddp(perforated(0))
    # no run_dir: writing switch_N and drawing history.png cost the same in both workflows
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=4,
                                   retain_all_dendrites=True)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01)
    opt, _ = ctl.build_optimizer()
    for _ in range(3):
        _steps(model, opt, data, 2)
        dist.barrier()
        start = time.perf_counter()
        decision = ctl.step(1.0, model=model)
        restructure_ms.append(1000 * (time.perf_counter() - start))
        model, opt = decision.model, decision.optimizer
    _steps(model, opt, data, 2)
    if rank == 0:
        ctl.save(Path(tmp) / "restart.safetensors")
        Path(out).write_text(json.dumps({"times": times, "restructure_ms": restructure_ms,
                                         "dendrites": ctl.num_dendrites}))
    dist.barrier()
    dist.destroy_process_group()


def _restart_probe(path: str) -> None:
    """What a restarted worker does before it can train again."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = perfora.perforate(make_mlp())
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=4)
    ctl.set_optimizer(torch.optim.SGD, lr=0.01)
    decision = ctl.load(path)
    DDP(decision.model)
    dist.barrier()
    dist.destroy_process_group()


def _restart_seconds(path: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(WORLD), __file__, "--restart-probe", str(path)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, timeout=300, env=env, capture_output=True)
    return time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds only (smoke run)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--restarts", type=int, default=3, help="restarts to time")
    output_paths.add_output_options(parser, OUTPUT, "--out")
    parser.add_argument("--restart-probe", help=argparse.SUPPRESS)
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "out")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.restart_probe:
        _restart_probe(args.restart_probe)
        return 0
    rounds, steps, restarts = ((3, 5, 1) if args.quick else
                               (args.rounds, args.steps, args.restarts))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.start_processes(_worker, args=(tmp, rounds, steps, out), nprocs=WORLD,
                           start_method="spawn")
        raw = json.loads(Path(out).read_text())
        restart_s = [_restart_seconds(Path(tmp) / "restart.safetensors")
                     for _ in range(restarts)]
    times = raw["times"]
    plain = times["plain"]
    rows = []
    for name, ts in times.items():
        ratios = [t / p for t, p in zip(ts, plain)]
        rows.append({"variant": name, "ms_per_step": 1000 * statistics.median(ts),
                     "ratio_to_plain": statistics.median(ratios)})
    by = {r["variant"]: r for r in rows}
    for k in (1, 2):
        unused, ours = times[f"find_unused K={k}"], times[f"perfora K={k}"]
        by[f"find_unused K={k}"]["ratio_to_perfora"] = statistics.median(
            [s / o for s, o in zip(unused, ours)])
    in_process_ms = statistics.median(raw["restructure_ms"])
    restart_ms = 1000 * statistics.median(restart_s)
    result = {
        "benchmark": "ddp", "torch": torch.__version__, "python": platform.python_version(),
        "ranks": WORLD, "backend": "gloo", "threads_per_rank": 1,
        "model": f"MLP {IN}-{WIDTH}x{DEPTH}-{OUT}, batch {BATCH} per rank",
        "rounds": rounds, "steps_per_round": steps, "rows": rows,
        "restructure_in_process_ms": raw["restructure_ms"],
        "restart_s": restart_s,
        "restart_over_in_process": restart_ms / in_process_ms,
        "seconds": time.perf_counter() - started,
    }
    print(f"{result['model']}, {WORLD} CPU ranks (gloo), {rounds} rounds x {steps} steps\n")
    print("| variant | ms/step | vs plain DDP | find_unused vs perfora |")
    print("|---|---|---|---|")
    for r in rows:
        extra = f"{r['ratio_to_perfora']:.2f}x" if "ratio_to_perfora" in r else ""
        print(f"| {r['variant']} | {r['ms_per_step']:.2f} | {r['ratio_to_plain']:.2f}x | "
              f"{extra} |")
    print(f"\none restructure in-process: {in_process_ms:.1f} ms (median of "
          f"{len(raw['restructure_ms'])}); one restart: {restart_ms:.0f} ms (median of "
          f"{len(restart_s)}); restart / in-process = {result['restart_over_in_process']:.0f}x")
    out = output_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
