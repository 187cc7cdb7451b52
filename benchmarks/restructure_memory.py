"""Peak memory per rank while an FSDP2 model restructures: shard-local against gather-based.

Each rank trains an MLP of ``--layers`` square Linear layers (``--width``) sharded with
``perfora.shard_fsdp2`` and Adam, on 2 gloo CPU ranks (``--ranks``), in fresh processes
with the malloc settings of ``rss.py``. Per rank it measures the peak resident memory
above the process's size before the model was built, during:

* a training step before the growth step and one after it (the steady state; the larger
  of the two is what the job needs anyway, since it goes on training the grown model);
* the best-model snapshot (``step`` with a new best), the growth step
  (``add_dendrites``), and the rewind to the best snapshot;
* then a neuron step (``add_neurons``: every hidden layer gains a quarter of its width, and
  its reader as many input columns), whose steady state also counts a training step of the
  widened model after it.

``shard-local`` is perfora's FSDP2 path (one layer, or for a neuron step one layer pair,
gathered at a time, snapshots as the rank's own shards); ``gather`` runs the same steps the
way perfora did before (and still does under FSDP1): every tensor gathered whole on every
rank, restructured, sharded again.

    python benchmarks/restructure_memory.py [--width 2048] [--layers 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import output_paths
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from rss import malloc_env, peak_rss_bytes, reset_peak_rss, rss_bytes
from torch import nn

OUTPUT = "restructure_memory.json"
TARGET = 1.2
MODES = ("shard-local", "gather")
OPERATIONS = ("snapshot", "grow", "rewind", "widen")
NEURONS_PER_STEP = 0.25
JOIN_S = 300


def _use_gather_based() -> None:
    """Restructure FSDP2 models as perfora did before shard-local growth (FSDP1 still does)."""
    from perfora.parallel.fsdp2 import FSDP2Backend
    from perfora.parallel.sharded import ShardedBackend

    for name in ("edit_layers", "snapshot", "whole", "restore", "widen"):
        setattr(FSDP2Backend, name, getattr(ShardedBackend, name))


def _peak_of(work) -> tuple[int, object]:
    """(peak resident size while ``work()`` ran, its result)."""
    reset_peak_rss()
    result = work()
    return peak_rss_bytes(), result


def _digest(model: nn.Module) -> str:
    """A hash of the full model state (a collective): equal on ranks and across modes."""
    from perfora.parallel.sharded_state import full_state_dict

    h = hashlib.sha256()
    for name, t in sorted(full_state_dict(model).items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def measure_rank(rank: int, world: int, spec: dict) -> dict:
    """The peaks of one rank (bytes above the size before the model was built)."""
    from torch.distributed.device_mesh import init_device_mesh

    import perfora
    from perfora.parallel import shard_fsdp2

    if spec["mode"] == "gather":
        _use_gather_based()
    base = rss_bytes()
    torch.manual_seed(0)
    width, depth = spec["width"], spec["layers"]
    blocks: list[nn.Module] = []
    for _ in range(depth):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    model = perfora.perforate(nn.Sequential(*blocks, nn.Linear(width, 10)))
    model = shard_fsdp2(model, mesh=init_device_mesh("cpu", (world,)))
    ctl = perfora.GrowthController(model, write_files=False, max_dendrites=3,
                                   neurons_per_step=NEURONS_PER_STEP)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-4)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(spec["batch"], width, generator=gen)
    y = torch.randint(0, 10, (spec["batch"],), generator=gen)
    probe = torch.randn(4, width, generator=torch.Generator().manual_seed(99))

    def train() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    train()  # the optimizer's state exists from here on
    peaks = {"before": _peak_of(train)[0]}
    peaks["snapshot"], decision = _peak_of(lambda: ctl.step(1.0, model=model))
    assert not decision.restructured and ctl._best is not None
    with torch.no_grad():
        out_before = model(probe)
    peaks["grow"], decision = _peak_of(ctl.add_dendrites)
    model, opt = decision.model, decision.optimizer
    with torch.no_grad():
        out_change = (model(probe) - out_before).abs().max().item()
    grown = _digest(model)
    train()
    peaks["after"] = _peak_of(train)[0]

    def rewind() -> nn.Module:
        ctl._rewind_to_best()
        ctl._rebuild_after_change()
        return ctl.model

    peaks["rewind"], model = _peak_of(rewind)
    with torch.no_grad():
        rewind_change = (model(probe) - out_before).abs().max().item()
    opt, params = ctl.optimizer, ctl.parameter_count()
    with torch.no_grad():
        out_before = model(probe)
    peaks["widen"], decision = _peak_of(ctl.add_neurons)
    model, opt = decision.model, decision.optimizer
    with torch.no_grad():
        widen_change = (model(probe) - out_before).abs().max().item()
    widened = _digest(model)
    train()
    peaks["after_widen"] = _peak_of(train)[0]
    return {"rank": rank, "peaks": {k: v - base for k, v in peaks.items()},
            "out_change": out_change, "rewind_change": rewind_change, "grown": grown,
            "widen_change": widen_change, "widened": widened,
            "params_widened": ctl.parameter_count(),
            "dendrites_after_rewind": ctl.num_dendrites, "params": params}


def _entry(rank: int, world: int, store: str, spec: dict, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        result = measure_rank(rank, world, spec)
        Path(out, f"result_{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(mode: str, width: int, layers: int, world: int = 2, batch: int = 16) -> list[dict]:
    """Run ``measure_rank`` on ``world`` fresh gloo processes; each rank's result."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    spec = {"mode": mode, "width": width, "layers": layers, "batch": batch}
    with tempfile.TemporaryDirectory() as tmp:
        with malloc_env():  # read by each new process's allocator at its start
            ctx = mp.start_processes(_entry, args=(world, str(Path(tmp, "store")), spec, tmp),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + JOIN_S
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not finish within {JOIN_S} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [json.loads(Path(tmp, f"result_{r}.json").read_text()) for r in range(world)]


def steady_states(peaks: dict[str, int]) -> dict[str, int]:
    """Each operation's steady state: the larger of the training steps before and after it
    (the dendrite operations: around the growth step; the neuron step: also after it)."""
    around_growth = max(peaks["before"], peaks["after"])
    return {**{op: around_growth for op in OPERATIONS},
            "widen": max(around_growth, peaks["after_widen"])}


def ratios(result: dict) -> dict[str, float]:
    """Each operation's peak over its steady state."""
    peaks = result["peaks"]
    steady = steady_states(peaks)
    return {op: peaks[op] / steady[op] for op in OPERATIONS}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    output_paths.add_output_options(ap, OUTPUT, "--json")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "json")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.width < 1 or args.layers < 1 or args.ranks < 1:
        ap.error("--width, --layers and --ranks must be positive")
    rows = []
    mib = 2 ** 20
    print(f"FSDP2 restructure memory, {args.ranks} gloo ranks, MLP {args.layers} x "
          f"{args.width}^2, Adam; MiB per rank above the process before the model")
    print(f"{'mode':<12} {'rank':>4} {'steady':>8} {'snapshot':>9} {'grow':>8} "
          f"{'rewind':>8} {'steady*':>8} {'widen':>8}   peak/steady (target <= {TARGET}; "
          "steady*: also after the neuron step)")
    for mode in MODES:
        for result in measure(mode, args.width, args.layers, args.ranks):
            p, r = result["peaks"], ratios(result)
            steady = steady_states(p)
            rows.append({"mode": mode, **result, "ratios": r, "steady": steady["grow"],
                         "steady_widen": steady["widen"]})
            print(f"{mode:<12} {result['rank']:>4} {steady['grow'] / mib:>8.0f} "
                  f"{p['snapshot'] / mib:>9.0f} {p['grow'] / mib:>8.0f} "
                  f"{p['rewind'] / mib:>8.0f} {steady['widen'] / mib:>8.0f} "
                  f"{p['widen'] / mib:>8.0f}   " +
                  "  ".join(f"{op} {r[op]:.2f}" for op in OPERATIONS))
    same = len({row["grown"] for row in rows}) == 1
    same_widened = len({row["widened"] for row in rows}) == 1
    print(f"grown model identical in both modes and on every rank: {same}; widened: "
          f"{same_widened}")
    path = output_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "restructure_memory", "width": args.width, "layers": args.layers,
        "ranks": args.ranks, "target": TARGET, "torch": torch.__version__,
        "machine": platform.machine(), "neurons_per_step": NEURONS_PER_STEP, "rows": rows,
        "identical": same, "identical_widened": same_widened}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
