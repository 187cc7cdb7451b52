"""GPU benchmark: step overhead (fp32 and bf16 autocast, eager and compiled), peak training
memory on CUDA, and a 2-process NCCL DDP step ratio, in about 5 minutes on one GPU.

The parts, in the order below while the time budget (``--budget-s``, default 270 s, so
that the run stays within about 5 minutes) lasts; a part or group that would not fit is
recorded as skipped, with the reason:

* ``overhead``: the table of ``overhead.py`` (the same models, batches and variants, timed
  interleaved, ratio over the counted-FLOP ideal) on the GPU, in float32 and under bf16
  autocast; the clock is the wall clock after ``torch.cuda.synchronize``;
* ``memory``: ``memory.py --device cuda`` (``max_memory_allocated`` in fresh processes);
* ``ddp``: with two or more GPUs, two processes over NCCL, one GPU each, the plain MLP and
  the perforated one with K = 0..3 under DDP; the step time ratio to the plain model (with
  ``--device cpu``, two gloo processes on the CPU);
* ``compiled``: the overhead table under ``torch.compile`` on both sides, one group per
  model (each variant compiles, and compiling dominates the time, so it comes last).

Targets are the CPU ones: K = 0 at most 1.03x, K >= 1 at most 1.10x the FLOP ideal, compiled
at most 1.05x for every K; memory within 1.1x of the formula.

    python benchmarks/gpu_bench.py                       # one GPU, about 5 minutes
    python benchmarks/gpu_bench.py --device cpu --quick --groups 1 --parts overhead
        # a dry run of the script itself, on a machine without a GPU

Writes ``results/local/gpu_bench_<device name>.json`` (git-ignored; ``--out`` to change it,
``--update-stored`` for the stored ``results/gpu_bench_<device name>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling benchmark scripts, run as modules

import memory  # noqa: E402
import output_paths  # noqa: E402
import overhead  # noqa: E402

PARTS = ("overhead", "memory", "ddp", "compiled")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
# compiled: one group per model, the batch where eager overhead matters most
COMPILED_GROUPS = (("mlp 784-256-256-10", 64), ("mlp 64-256-256-10", 256),
                   ("cnn 28x28 c16-c32-c32", 64))
DDP_KS = (0, 1, 2, 3)


class Deadline:
    """The time left of the budget, and whether a piece of work of a given length fits."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.perf_counter() + budget_s

    def left(self) -> float:
        return max(self.end - time.perf_counter(), 0.0)

    def fits(self, estimate_s: float) -> bool:
        return self.left() >= estimate_s


def _plan(quick: bool) -> dict:
    if quick:
        return {"budget_s": 0.5, "min_repeats": 3, "max_repeats": 3, "min_sample_s": 0.002,
                "warmup": 2}
    return {"budget_s": 3.0, "min_repeats": 7, "max_repeats": 21, "min_sample_s": 0.01,
            "warmup": 5}


def overhead_part(device: str, groups, deadline: Deadline, quick: bool,
                  compiled: bool) -> dict:
    """Rows of the overhead table per precision; groups that would overrun are skipped.
    A group's time is guessed from the one before (the first: 5 s eager, 30 s compiled)."""
    out: dict = {"rows": {}, "skipped": []}
    plan = _plan(quick)
    last_s = 30.0 if compiled and not quick else 5.0 if not quick else 0.0
    for precision, dtype in PRECISIONS.items():
        rows: list[dict] = []
        for name, batch in groups:
            if not deadline.fits(last_s):
                out["skipped"].append({"group": [name, batch], "precision": precision,
                                       "reason": f"time budget: {deadline.left():.0f} s "
                                                 f"left, the last group took {last_s:.0f} s"})
                continue
            start = time.perf_counter()
            rows += overhead.run_group(name, batch, seed=0, clock=time.perf_counter,
                                       compiled=compiled, device=device, autocast=dtype,
                                       **plan)
            last_s = time.perf_counter() - start
        for row in rows:
            row["precision"] = precision
            if compiled:
                row["target"] = overhead.TARGET_COMPILED
                row["meets_target"] = bool(row["measured_over_ideal"] <= row["target"])
        out["rows"][precision] = rows
    return out


def memory_part(device: str, deadline: Deadline) -> dict:
    """``memory.py`` on the device, once per configuration (about a minute on a GPU)."""
    if not deadline.fits(60):
        return {"skipped": f"time budget: {deadline.left():.0f} s left, memory needs ~60 s"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.json"
        memory.main(["--device", device, "--repeats", "1", "--out", str(path)])
        return json.loads(path.read_text())


def _ddp_worker(rank: int, backend: str, store_path: str, rounds: int, steps: int,
                out: str) -> None:
    import ddp as ddp_bench
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import perfora

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    wrap = {"device_ids": [rank]} if cuda else {}
    store = dist.FileStore(store_path, 2)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(ddp_bench.BATCH, ddp_bench.IN, generator=g).to(dev),
             torch.randint(0, ddp_bench.OUT, (ddp_bench.BATCH,), generator=g).to(dev))
            for _ in range(steps)]
    variants = {"plain": DDP(ddp_bench.make_mlp().to(dev), **wrap)}
    for k in DDP_KS:
        variants[f"K={k}"] = perfora.wrap_ddp(ddp_bench.perforated(k).to(dev), **wrap)
    opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in variants.items()}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(name: str) -> float:
        model, opt = variants[name], opts[name]
        sync()
        start = time.perf_counter()
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        sync()
        return (time.perf_counter() - start) / len(data)

    names = list(variants)
    for name in names:
        timed(name)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(name))
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def ddp_part(device: str, deadline: Deadline, quick: bool) -> dict:
    """Two ranks under DDP: NCCL with one GPU each (skipped with fewer than two GPUs), or
    gloo on the CPU for a dry run."""
    if device == "cuda":
        count = torch.cuda.device_count()
        if count < 2:
            return {"skipped": f"{count} GPU(s): the NCCL DDP ratio needs two"}
    if not deadline.fits(45):
        return {"skipped": f"time budget: {deadline.left():.0f} s left, DDP needs ~45 s"}
    import torch.multiprocessing as mp

    backend = "nccl" if device == "cuda" else "gloo"
    rounds, steps = (3, 5) if quick else (15, 20)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.start_processes(_ddp_worker,
                           args=(backend, os.path.join(tmp, "store"), rounds, steps, out),
                           nprocs=2, join=True, start_method="spawn")
        times = json.loads(Path(out).read_text())
    plain = times["plain"]
    rows = []
    for k in DDP_KS:
        t = times[f"K={k}"]
        rows.append({"K": k, "step_ms": 1e3 * statistics.median(t),
                     "plain_ms": 1e3 * statistics.median(plain),
                     "ratio": statistics.median(a / b for a, b in zip(t, plain))})
    return {"ranks": 2, "backend": backend, "rounds": rounds, "steps": steps, "rows": rows}


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def print_summary(result: dict) -> None:
    for mode in ("overhead", "compiled"):
        part = result.get(mode)
        if not part:
            continue
        for precision, rows in part["rows"].items():
            if rows:
                print(f"\n{mode}, {precision}:")
                overhead.print_table(rows)
        for skip in part["skipped"]:
            print(f"{mode}: skipped {skip['group']} {skip['precision']}: {skip['reason']}")
    mem = result.get("memory")
    if mem and "rows" in mem:
        print("\nmemory (ratio to the formula):")
        for r in mem["rows"]:
            print(f"  {r['model']:<22} {r['variant']:<9} {r['peak_mb']:8.1f} MB "
                  f"{r['ratio_to_required']:.3f}x")
    ddp = result.get("ddp")
    if ddp and "rows" in ddp:
        print(f"\nDDP, 2 {ddp['backend']} ranks: " + ", ".join(f"K={r['K']} {r['ratio']:.2f}x"
                                                   for r in ddp["rows"]))
    for part in ("memory", "ddp"):
        if result.get(part) and "skipped" in result[part]:
            print(f"{part}: skipped: {result[part]['skipped']}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default); cpu only for a dry run of the script")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run, of {','.join(PARTS)} (default all)")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="time budget; work that would overrun it is skipped and recorded")
    ap.add_argument("--groups", type=int, default=None,
                    help="only the first N (model, batch) groups of the overhead table")
    ap.add_argument("--quick", action="store_true", help="few rounds (smoke run)")
    ap.add_argument("--out", type=Path, default=None,
                    help=output_paths.default_help("gpu_bench_<device>.json"))
    output_paths.add_update_stored(ap)
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    name = f"gpu_bench_{_slug(_device_name(args.device))}.json"
    return output_paths.output_file(args, name, "out")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.budget_s < 0:
        ap.error(f"--budget-s must not be negative, got {args.budget_s}")
    if args.groups is not None and args.groups < 1:
        ap.error(f"--groups must be at least 1, got {args.groups}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench.py: no CUDA device here. It measures a GPU; for a dry run of the "
              "script itself use --device cpu --quick --groups 1", file=sys.stderr)
        return 2

    deadline = Deadline(args.budget_s)
    name = _device_name(args.device)
    out = output_path(args)
    groups = overhead.GROUPS[:args.groups] if args.groups else overhead.GROUPS
    print(f"perfora gpu_bench: {name}, torch {torch.__version__}, parts {','.join(parts)}, "
          f"budget {args.budget_s:.0f} s", flush=True)
    start = time.perf_counter()
    result: dict = {"benchmark": "gpu_bench", "device": name, "device_type": args.device,
                    "torch": torch.__version__, "quick": args.quick, "parts": parts,
                    "budget_s": args.budget_s}
    if "overhead" in parts:
        result["overhead"] = overhead_part(args.device, groups, deadline, args.quick, False)
    if "memory" in parts:
        result["memory"] = memory_part(args.device, deadline)
    if "ddp" in parts:
        result["ddp"] = ddp_part(args.device, deadline, args.quick)
    if "compiled" in parts:
        wanted = [g for g in COMPILED_GROUPS if g in groups] or list(groups[:1])
        result["compiled"] = overhead_part(args.device, wanted, deadline, args.quick, True)
    result["seconds"] = time.perf_counter() - start
    print_summary(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nTook {result['seconds']:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
