"""Training-step overhead of dendrites: converted model with K dendrites vs the plain model.

For each model (two MLPs and a small CNN) and batch size, this times one training step
(forward + backward + ``torch.optim.SGD`` step) of the plain, unconverted model and of the
same model converted by ``perfora.perforate`` with K = 0, 1, 2, 3 dendrites per layer.
All variants of one (model, batch) group are timed *interleaved*: every round runs each
variant once (in a rotated order), so drift in clock speed or machine load hits all of
them alike. The reported ratio is the median over rounds of ``t(variant) / t(plain)``
from the same round.

The FLOP-proportional ideal is measured, not assumed: ``torch.utils.flop_counter`` counts
the matmul/conv FLOPs of one forward+backward of each variant, and ``ideal`` is
``flops(K) / flops(plain)``. Only the wrapped layers' FLOPs scale, by K + 1, so
``ideal = 1 + K * f`` with ``f`` the wrapped fraction of the plain model's FLOPs; every
Linear/Conv is wrapped here, so ``f = 1`` and ``ideal = K + 1``. Elementwise work
(activations, the cascade, ``v``, the optimizer) is not counted: it is what the
targets bound.

Targets: K = 0 at most 1.03x the plain model; K >= 1 at most 1.10x the ideal. With
``--compile`` (both sides compiled) every K, K = 0 included, at most 1.05x the ideal.

Each (model, batch) group gets as many rounds as fit a ~25 s budget (at least 7), so the
default run (six groups) takes about 4-5 minutes on 2 cores. On a shared, busy machine wall-clock
times with several threads are dominated by preemption; ``--threads 1 --clock cpu``
(process CPU time) then gives far steadier ratios.

    python benchmarks/overhead.py                 # ~4-5 minutes on 2 cores
    python benchmarks/overhead.py --quick         # smoke run, 3 rounds per group
    python benchmarks/overhead.py --threads 1 --clock cpu --out /tmp/overhead.json
    python benchmarks/overhead.py --compile --threads 1 --clock cpu   # compiled, both sides
    python benchmarks/overhead.py --floor --threads 1 --clock cpu     # + same-GEMM models

``--floor`` adds, for each K, the *same-GEMM* model to every round: the plain model with
each Linear/Conv replaced by K + 1 copies of itself whose outputs are summed. It has the
matmul/conv FLOPs of K dendrites through ordinary autograd layers and none of the dendrite
mix (activations, cascade, ``v``), so its ratio over the ideal is what this machine charges
for the extra GEMMs alone (caches, per-call costs), and the gap between it and the
perforated model is the mix's own cost.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import output_paths
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import perfora
from perfora.nn.layers import dendritic_layers
from perfora.nn.row_bank import RowBankLayer

KS = (0, 1, 2, 3)
TARGET_K0 = 1.03
TARGET_IDEAL = 1.10
TARGET_COMPILED = 1.05  # compiled on both sides: every K, K = 0 included, over the ideal
OUTPUT = "overhead.json"  # overhead_{compiled,unfused,floor}.json for those variants


# ---------------------------------------------------------------------- models
def make_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256), nn.ReLU(),
        nn.Linear(256, 256), nn.ReLU(),
        nn.Linear(256, 10),
    )


def make_small_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(),
        nn.Linear(256, 256), nn.ReLU(),
        nn.Linear(256, 10),
    )


def make_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 28 -> 14
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 14 -> 7
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


MODELS = {
    "mlp 784-256-256-10": (make_mlp, (1, 28, 28)),
    "mlp 64-256-256-10": (make_small_mlp, (64,)),
    "cnn 28x28 c16-c32-c32": (make_cnn, (1, 28, 28)),
}
# (model, batch) groups, in table order
GROUPS = (
    ("mlp 784-256-256-10", 64), ("mlp 784-256-256-10", 512),
    ("mlp 64-256-256-10", 256),
    ("cnn 28x28 c16-c32-c32", 32), ("cnn 28x28 c16-c32-c32", 64),
    ("cnn 28x28 c16-c32-c32", 512),
)


def converted(plain: nn.Module, k: int, seed: int) -> nn.Module:
    """A deep copy of ``plain``, perforated, with K dendrites per wrapped layer.

    ``v`` (out_weight) and the cascade get small random nonzero values so that every
    term of the dendrite forward is live (no zero shortcut can apply).
    """
    model = perfora.perforate(copy.deepcopy(plain))
    layers = dendritic_layers(model)
    gen = torch.Generator().manual_seed(seed)
    for i, (_, layer) in enumerate(sorted(layers.items())):
        for j in range(k):
            layer.grow(torch.Generator().manual_seed(seed * 1000 + i * 10 + j))
        with torch.no_grad():
            for p in (layer.out_weight, layer.cascade):
                if p is not None:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


class SameGemms(nn.Module):
    """K + 1 copies of a Linear/Conv, outputs summed: the GEMM/conv FLOPs of a layer with K
    dendrites, without the dendrite mix (the ``--floor`` reference)."""

    def __init__(self, layer: nn.Module, copies: int) -> None:
        super().__init__()
        self.copies = nn.ModuleList(copy.deepcopy(layer) for _ in range(copies))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.copies[0](x)
        for layer in self.copies[1:]:
            out = out + layer(x)
        return out


def same_gemms(plain: nn.Module, k: int) -> nn.Module:
    """A deep copy of ``plain`` with every Linear/Conv replaced by K + 1 summed copies."""
    model = copy.deepcopy(plain)
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                setattr(module, child_name, SameGemms(child, k + 1))
    return model


def variant_names(floor: bool = False) -> list[str]:
    names = ["plain"] + [f"K={k}" for k in KS]
    return names + [f"floor K={k}" for k in KS if k] if floor else names


# ---------------------------------------------------------------------- timing
class Runner:
    """One variant: a model, its own SGD optimizer, and a fixed batch.

    ``autocast`` (a dtype or None) runs forward and loss under ``torch.autocast`` on the
    batch's device; on CUDA every timing waits for the device before reading the clock.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 clock=time.perf_counter, autocast: torch.dtype | None = None) -> None:
        self.model = model
        self.x, self.y = x, y
        self.clock = clock
        self.autocast = autocast
        self.cuda = x.device.type == "cuda"
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.autocast is None:  # no context manager in the timed loop when not needed
            loss = F.cross_entropy(self.model(self.x), self.y)
        else:
            with torch.autocast(self.x.device.type, dtype=self.autocast):
                loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()

    def timed(self, n: int) -> float:
        """Seconds per step, averaged over ``n`` back-to-back steps."""
        if self.cuda:
            torch.cuda.synchronize(self.x.device)
        t0 = self.clock()
        for _ in range(n):
            self.step()
        if self.cuda:
            torch.cuda.synchronize(self.x.device)
        return (self.clock() - t0) / n


def step_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Matmul/conv FLOPs of one forward+backward (what the FLOP counter knows)."""
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def run_group(name: str, batch: int, *, budget_s: float, min_repeats: int, max_repeats: int,
              min_sample_s: float, warmup: int, seed: int, clock,
              compiled: bool = False, floor: bool = False, device: str = "cpu",
              autocast: torch.dtype | None = None) -> list[dict]:
    build, in_shape = MODELS[name]
    torch.manual_seed(seed)
    plain = build().to(device)
    x = torch.randn(batch, *in_shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    models = {"plain": plain}
    for k in KS:
        models[f"K={k}"] = converted(plain, k, seed + k)
    if floor:
        for k in KS[1:]:
            models[f"floor K={k}"] = same_gemms(plain, k)
    # FLOPs scale linearly in the batch, so a small batch gives the same ratios, cheaply.
    flops = {v: step_flops(m, x[:8], y[:8]) for v, m in models.items()}
    if compiled:  # both sides compiled; the warm-up steps below pay the compilation
        torch._dynamo.reset()
        runners = {v: Runner(torch.compile(m), x, y, clock, autocast)
                   for v, m in models.items()}
    else:
        runners = {v: Runner(m, x, y, clock, autocast) for v, m in models.items()}
    first = {}
    for v, r in runners.items():
        for _ in range(warmup):
            r.step()
        first[v] = min(r.timed(1) for _ in range(2))
    # Inner steps per sample: enough that the plain model's sample lasts min_sample_s.
    inner = max(1, round(min_sample_s / max(first["plain"], 1e-7)))
    round_s = inner * sum(first.values())
    repeats = int(min(max_repeats, max(min_repeats, budget_s // max(round_s, 1e-9))))

    names = variant_names(floor)
    times: dict[str, list[float]] = {v: [] for v in names}
    for rnd in range(repeats):
        shift = rnd % len(names)
        for v in names[shift:] + names[:shift]:
            times[v].append(runners[v].timed(inner))
    print(f"  {name}, batch {batch}: {repeats} rounds x {inner} step(s) per variant",
          flush=True)

    plain_t = times["plain"]
    rows = []
    base_flops = flops["plain"]
    wrapped_frac = (flops["K=1"] - base_flops) / base_flops
    for k in KS:
        v = f"K={k}"
        ratios = [a / b for a, b in zip(times[v], plain_t)]
        ratio = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratio, ratio, ratio]
        ideal = flops[v] / base_flops
        rel = ratio / ideal
        target = TARGET_COMPILED if compiled else TARGET_K0 if k == 0 else TARGET_IDEAL
        rows.append({
            "model": name, "batch": batch, "K": k,
            "plain_ms": 1e3 * statistics.median(plain_t),
            "variant_ms": 1e3 * statistics.median(times[v]),
            "ratio": ratio, "ratio_q1": q[0], "ratio_q3": q[2],
            "ideal": ideal, "wrapped_flop_fraction": wrapped_frac,
            "flops_plain": base_flops, "flops_variant": flops[v],
            "measured_over_ideal": rel,
            "target": target,
            "meets_target": bool((ratio if k == 0 else rel) <= target),
            "repeats": repeats, "inner_steps": inner,
        })
        if floor and k:
            f = f"floor K={k}"
            floor_ratio = statistics.median(a / b for a, b in zip(times[f], plain_t))
            rows[-1].update({
                "floor_ms": 1e3 * statistics.median(times[f]),
                "floor_ratio": floor_ratio,
                "floor_ideal": flops[f] / base_flops,
                "floor_over_ideal": floor_ratio / (flops[f] / base_flops),
            })
    return rows


# ---------------------------------------------------------------------- report
def targets_line(compiled: bool) -> str:
    if compiled:
        return f"every K ratio/ideal <= {TARGET_COMPILED} (compiled)"
    return f"K=0 ratio <= {TARGET_K0}, K>=1 ratio/ideal <= {TARGET_IDEAL}"


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':<22} {'batch':>5} {'K':>2} {'plain ms':>9} {'K ms':>9} "
            f"{'ratio':>7} {'[q1, q3]':>13} {'ideal':>6} {'ratio/ideal':>11} {'target':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        tgt = (f"ratio<={r['target']:.2f}" if r["K"] == 0 else f"r/id<={r['target']:.2f}")
        mark = "ok" if r["meets_target"] else "MISS"
        floor = f"  floor {r['floor_over_ideal']:.3f}" if "floor_over_ideal" in r else ""
        print(f"{r['model']:<22} {r['batch']:>5} {r['K']:>2} {r['plain_ms']:>9.3f} "
              f"{r['variant_ms']:>9.3f} {r['ratio']:>6.3f}x "
              f"[{r['ratio_q1']:5.2f},{r['ratio_q3']:5.2f}] {r['ideal']:>5.2f}x "
              f"{r['measured_over_ideal']:>11.3f} {tgt:>10} {mark:>4}{floor}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: torch's default)")
    output_paths.add_output_options(ap, OUTPUT, "--out")
    ap.add_argument("--repeats", type=int, default=None,
                    help="rounds per group (default: as many as fit a time budget)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter; cpu: process CPU time, steadier on a busy "
                         "machine (use it with --threads 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile both the plain and the perforated models "
                         "(default output: overhead_compiled.json)")
    ap.add_argument("--unfused", action="store_true",
                    help="time the plain autograd mix instead of perfora.nn.kernels.FusedMix "
                         "(the code before the fused node; default output: "
                         "overhead_unfused.json)")
    ap.add_argument("--floor", action="store_true",
                    help="also time, for each K, the plain model with every Linear/Conv "
                         "replaced by K+1 summed copies: the same GEMMs without the dendrite "
                         "mix (default output: overhead_floor.json)")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored), named
    after the variant (``_quick`` for a ``--quick`` smoke run)."""
    name = ("overhead_floor.json" if args.floor else "overhead_compiled.json" if args.compile
            else "overhead_unfused.json" if args.unfused else OUTPUT)
    if args.quick:  # a smoke run never overwrites a real run's file
        name = name.replace(".json", "_quick.json")
    return output_paths.output_file(args, name, "out")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.floor and (args.compile or args.unfused):
        ap.error("--floor compares the eager fused model with the same-GEMM model; run it "
                 "without --compile and --unfused")
    if args.unfused:
        RowBankLayer._fused_spec = lambda self, x, y: None

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        plan = {"budget_s": 1.0, "min_repeats": 3, "max_repeats": 3, "min_sample_s": 0.002,
                "warmup": 3}
    else:
        plan = {"budget_s": 25.0, "min_repeats": 7, "max_repeats": 41, "min_sample_s": 0.02,
                "warmup": 5}
    if args.repeats:
        plan["min_repeats"] = plan["max_repeats"] = args.repeats

    print(f"perfora overhead: torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{platform.machine()}, {args.clock} clock{' (quick)' if args.quick else ''}"
          f"{', torch.compile on both sides' if args.compile else ''}"
          f"{', unfused (autograd mix)' if args.unfused else ''}"
          f"{', with same-GEMM floor models' if args.floor else ''}; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    t0 = time.perf_counter()
    rows: list[dict] = []
    for name, batch in GROUPS:
        rows += run_group(name, batch, seed=args.seed, clock=clock, compiled=args.compile,
                          floor=args.floor,
                          **plan)
    elapsed = time.perf_counter() - t0
    print()
    print_table(rows)
    print(f"\nratio = median over rounds of t(variant)/t(plain), one step = forward + "
          f"backward + SGD step;\nideal = counted matmul/conv FLOPs of the variant / plain "
          f"(= 1 + K*f, f = wrapped fraction = {rows[0]['wrapped_flop_fraction']:.3f});\n"
          f"targets: {targets_line(args.compile)}. "
          f"Took {elapsed:.1f} s.")

    result = {
        "benchmark": "overhead",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "clock": args.clock,
        "compiled": args.compile,
        "fused": not args.unfused,
        "floor": args.floor,
        "load_average": list(os.getloadavg()),
        "plan": plan,
        "seconds": elapsed,
        "targets": ({"k0_ratio_max": TARGET_COMPILED, "ratio_over_ideal_max": TARGET_COMPILED}
                    if args.compile else
                    {"k0_ratio_max": TARGET_K0, "ratio_over_ideal_max": TARGET_IDEAL}),
        "all_met": all(r["meets_target"] for r in rows),
        "rows": rows,
    }
    out = output_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
