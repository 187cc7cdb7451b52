"""Checkpoint write and load time against model size: one safetensors file against DCP.

Two CPU ranks on gloo (spawned processes, a FileStore), one thread each. For every model size
an MLP is perforated, sharded with FSDP2 over both ranks, grown once and trained one step
with Adam (so the optimizer holds moments), then, interleaved over ``--repeats`` rounds:

- ``file``: ``controller.save("x.safetensors")``: the full model and optimizer state gathered
  on every rank, rank 0 encodes and writes one file;
  ``controller.load(...)`` of it into a fresh sharded model on both ranks.
- ``dcp``: ``controller.save("x.dcp")``: every rank writes its own shards through
  ``torch.distributed.checkpoint``, rank 0 writes ``perfora.json``;
  ``controller.load(...)`` of it (structure fitted, re-sharded, shards read).

A time is the slower rank's, from a barrier before the call to the end of the call; the
table shows medians over rounds. Writes are fsynced unless ``--no-fsync``.

    python benchmarks/checkpoint_io.py              # a few minutes on 2 cores
    python benchmarks/checkpoint_io.py --quick      # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import output_paths
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import perfora

WORLD = 2
OUTPUT = "checkpoint_io.json"
IN, OUT, DEPTH = 64, 10, 3


def make_mlp(width: int, seed: int = 0) -> nn.Module:
    """A perforated MLP 64-width x3-10."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    fan_in = IN
    for _ in range(DEPTH):
        layers += [nn.Linear(fan_in, width), nn.ReLU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, OUT))
    return perfora.perforate(nn.Sequential(*layers))


def controller(width: int, seed: int) -> perfora.GrowthController:
    """A controller over the sharded MLP, Adam registered, no run files."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    model = perfora.shard_fsdp2(make_mlp(width, seed), mesh=mesh)
    ctl = perfora.GrowthController(model, dendrite_init="default", write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    return ctl


def timed(fn, *args) -> float:
    """Seconds of ``fn(*args)`` on the slower rank, from a common start."""
    dist.barrier()
    start = time.perf_counter()
    fn(*args)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds)


def folder_bytes(path: Path) -> int:
    """Bytes of a file, or of the files of a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def rank_main(rank: int, store_dir: str, work: str, widths: list[int], repeats: int,
              result: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(store_dir, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    rows = []
    try:
        for width in widths:
            ctl = controller(width, seed=0)
            ctl.add_dendrites()
            opt = ctl.optimizer
            x = torch.randn(32, IN, generator=torch.Generator().manual_seed(rank))
            opt.zero_grad()
            ctl.model(x).square().mean().backward()
            opt.step()
            times: dict[str, dict[str, list[float]]] = {f: {"write": [], "load": []}
                                                        for f in ("file", "dcp")}
            paths = {"file": Path(work, f"w{width}.safetensors"),
                     "dcp": Path(work, f"w{width}.dcp")}
            for round_ in range(repeats):
                order = ("file", "dcp") if round_ % 2 == 0 else ("dcp", "file")
                for fmt in order:
                    times[fmt]["write"].append(timed(ctl.save, paths[fmt]))
                    fresh = controller(width, seed=1)
                    times[fmt]["load"].append(timed(fresh.load, paths[fmt]))
                    del fresh
            row = {"width": width, "params": ctl.parameter_count(),
                   "bytes": {f: folder_bytes(p) for f, p in paths.items()}}
            for fmt, entry in times.items():
                row[fmt] = {k: statistics.median(v) for k, v in entry.items()}
                row[fmt]["all"] = entry
            rows.append(row)
            dist.barrier()
    finally:
        if rank == 0:
            Path(result).write_text(json.dumps(rows))
        dist.destroy_process_group()


def table(rows: list[dict]) -> str:
    """The Markdown table of medians."""
    lines = ["| params (with K=1) | checkpoint MB | write: file | write: DCP | load: file "
             "| load: DCP |", "|---|---|---|---|---|---|"]
    for r in rows:
        mb = r["bytes"]["file"] / 2**20
        lines.append(f"| {r['params'] / 1e6:.2f} M | {mb:.1f} | {r['file']['write']:.3f} s "
                     f"| {r['dcp']['write']:.3f} s | {r['file']['load']:.3f} s "
                     f"| {r['dcp']['load']:.3f} s |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="two small sizes, one round")
    parser.add_argument("--no-fsync", action="store_true", help="PERFORA_FSYNC=0")
    output_paths.add_output_options(parser, OUTPUT, "--out")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "out")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick and args.update_stored:
        parser.error("--quick is a smoke run: its results are not stored")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    widths, repeats = ([64, 256], 1) if args.quick else (args.widths, args.repeats)
    os.environ["PERFORA_FSYNC"] = "0" if args.no_fsync else "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp, "work")
        work.mkdir()
        result = Path(tmp, "rows.json")
        mp.start_processes(rank_main, args=(tmp, str(work), widths, repeats, str(result)),
                           nprocs=WORLD, start_method="spawn")
        rows = json.loads(result.read_text())
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    out = {"benchmark": "checkpoint_io", "world": WORLD, "backend": "gloo",
           "model": f"FSDP2 MLP {IN}-<width>x{DEPTH}-{OUT}, K=1, Adam", "repeats": repeats,
           "fsync": not args.no_fsync, "torch": torch.__version__,
           "perfora": perfora.__version__, "machine": platform.machine(),
           "cpus": os.cpu_count(), "rows": rows}
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
