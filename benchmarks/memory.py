"""Peak training memory of dendrites: converted model with K dendrites vs the plain model.

Each configuration (model, batch, variant) runs in a fresh Python process: it builds the
model, converts it with ``perfora.perforate`` and grows K dendrites per wrapped layer (or
not, for ``plain``), builds ``torch.optim.SGD`` with momentum and runs a few training steps
(forward, backward, step). The measured quantity is the *training memory*:

* CPU: the process's peak resident set size during the last training steps (``VmHWM``,
  reset through ``/proc/self/clear_refs`` just before them) minus its resident size just
  before the model was built (imports, data, the interpreter). The child runs with a fixed
  glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) so a freed
  tensor's memory goes back to the system at once and the resident size follows the live
  tensors; with glibc's adaptive threshold, freed feature maps stay in the heap and the
  peak depends on the order of frees more than on what is alive (tens of MB either way);
* CUDA (``--device cuda``): ``torch.cuda.max_memory_allocated()`` over the same steps, less
  the memory allocated before the model was built.

What the dendrites require, by the formula (``4`` bytes a float32)::

    extra = 4 * (P_K - P_plain) * (2 + s)      weights, their gradients, s optimizer slots
          + 4 * K * sum_l numel(output of wrapped layer l)      d_k, kept for backward

with ``P`` the parameter count (each wrapped layer gains K copies of its weights, K rows of
``v`` and K(K-1)/2 cascade rows) and ``s = 1`` for SGD with momentum. ``required = plain
training memory + extra``; the target is ``measured <= 1.10 * required`` for K >= 1 and
``measured <= 1.02 * plain`` for K = 0. The formula leaves out what backward needs while it
runs: gradients of the dendrite outputs of the layer being differentiated, next to the
buffers of its convolution backward. The fused conv backward keeps few of them alive at
once (at most 1 / 2 / 3 for K = 2 / 3 / 5), so a conv net, whose first feature maps are
large, sits above the formula by a few percent.

``grown 5x`` runs the restructure path: K = 0, then five times ``layer.grow()`` (five
restructures, each replacing the bank, cascade and ``v`` parameters and rebuilding the
optimizer), with training steps between; the peak of its last steps is compared with a
fresh model built with K = 5 directly (``K=5``). Equal peaks mean nothing is kept alive
across a restructure. (A restructure itself briefly holds the old and the new bank of one
layer: a transient outside the training steps measured here.)

    python benchmarks/memory.py                  # CPU, about a minute
    python benchmarks/memory.py --device cuda    # CUDA, when available
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import output_paths
from rss import MALLOC_ENV, peak_rss_bytes, reset_peak_rss, rss_bytes

OUTPUT = "memory.json"  # memory_cuda.json with --device cuda
TARGET_K0 = 1.02
TARGET_REQUIRED = 1.10
STEPS = 3
# (model, batch): models big enough that their training memory stands well above the
# allocator's noise (a few MB)
CONFIGS = (("mlp 784-1024-1024-10", 256), ("cnn 28x28 c16-c32-c32", 256))
VARIANTS = ("plain", "K=0", "K=1", "K=2", "K=3", "K=5", "grown 5x")


# ------------------------------------------------------------------------------ the child
def _build(name: str):
    from torch import nn
    if name.startswith("mlp"):
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def child(spec: dict) -> dict:
    """One configuration, in this (fresh) process; returns its numbers."""
    import torch
    import torch.nn.functional as F

    import perfora
    from perfora.nn.layers import dendritic_layers

    torch.set_num_threads(1)
    device = torch.device(spec["device"])
    torch.manual_seed(0)
    x = torch.randn(spec["batch"], 1, 28, 28, device=device)
    y = torch.randint(0, 10, (spec["batch"],), device=device)
    # warm the kernels once on a throwaway model, so their one-off buffers are in the base
    warm = _build(spec["model"]).to(device)
    F.cross_entropy(warm(x), y).backward()
    del warm
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    base_rss = rss_bytes()

    variant = spec["variant"]
    model = _build(spec["model"]).to(device)
    plain_params = sum(p.numel() for p in model.parameters())
    outputs: dict[str, int] = {}

    def train(steps: int, opt) -> None:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

    def new_optimizer():
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    if variant != "plain":
        model = perfora.perforate(model)
        layers = dendritic_layers(model)
        hooks = [layer.register_forward_hook(
            lambda m, i, o, p=path: outputs.__setitem__(p, o.numel()))
            for path, layer in layers.items()]
        with torch.no_grad():
            model(x)
        for h in hooks:
            h.remove()
        if variant == "grown 5x":
            k = 5
            opt = new_optimizer()
            train(STEPS, opt)
            for step in range(k):
                for i, layer in enumerate(layers.values()):
                    layer.grow(torch.Generator().manual_seed(10 * i + step))
                opt = new_optimizer()  # a restructure rebuilds the optimizer
                train(STEPS, opt)
        else:
            k = int(variant.split("=")[1])
            for i, layer in enumerate(layers.values()):
                for j in range(k):
                    layer.grow(torch.Generator().manual_seed(10 * i + j))
            opt = new_optimizer()
            train(STEPS, opt)
        with torch.no_grad():  # every term live, as after training
            for layer in layers.values():
                for p in (layer.out_weight, layer.cascade):
                    if p is not None:
                        p.normal_(0, 0.05)
    else:
        k = 0
        opt = new_optimizer()
        train(STEPS, opt)
    # the measured steps: optimizer state and gradients exist, nothing else has changed
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()
    train(STEPS, opt)

    params = sum(p.numel() for p in model.parameters())
    result = {"params": params, "plain_params": plain_params, "K": k,
              "wrapped_output_numel": sum(outputs.values())}
    if device.type == "cuda":
        torch.cuda.synchronize()
        result["peak_bytes"] = torch.cuda.max_memory_allocated() - base
    else:
        result["peak_bytes"] = peak_rss_bytes() - base_rss
    return result


# ----------------------------------------------------------------------------- the parent
def run_child(spec: dict) -> dict:
    """One configuration in a fresh process (with the fixed malloc thresholds on the CPU)."""
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        raise SystemExit(f"child {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def required_extra(r: dict, slots: int = 1) -> int:
    """Bytes the dendrites need by the formula: weights, grads, optimizer slots, the d_k."""
    return 4 * ((r["params"] - r["plain_params"]) * (2 + slots)
                + r["K"] * r["wrapped_output_numel"])


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=3,
                    help="fresh processes per configuration (median taken)")
    ap.add_argument("--out", type=Path, default=None, help=output_paths.default_help(
        OUTPUT + ", memory_cuda.json for --device cuda"))
    output_paths.add_update_stored(ap)
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    name = OUTPUT if args.device == "cpu" else "memory_cuda.json"
    return output_paths.output_file(args, name, "out")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    out = output_path(args)
    print(f"perfora memory: {args.device}, {platform.machine()}, {args.repeats} fresh "
          f"process(es) per configuration; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    t0 = time.perf_counter()
    rows = []
    for model, batch in CONFIGS:
        by_variant: dict[str, list[dict]] = {}
        for variant in VARIANTS:
            spec = {"model": model, "batch": batch, "variant": variant, "device": args.device}
            by_variant[variant] = [run_child(spec) for _ in range(args.repeats)]
        plain = _median([r["peak_bytes"] for r in by_variant["plain"]])
        for variant in VARIANTS:
            runs = by_variant[variant]
            peak = _median([r["peak_bytes"] for r in runs])
            r = runs[0]
            extra = required_extra(r) if variant != "plain" else 0
            required = plain + extra
            ratio = peak / plain
            over = peak / required
            k = r["K"]
            row = {"model": model, "batch": batch, "variant": variant, "K": k,
                   "params": r["params"], "peak_mb": peak / 2**20,
                   "peaks_mb": [x["peak_bytes"] / 2**20 for x in runs],
                   "plain_mb": plain / 2**20, "required_extra_mb": extra / 2**20,
                   "required_mb": required / 2**20, "ratio_to_plain": ratio,
                   "ratio_to_required": over}
            if variant == "K=0":
                row["target"] = f"ratio_to_plain <= {TARGET_K0}"
                row["meets_target"] = ratio <= TARGET_K0
            elif variant != "plain":
                row["target"] = f"ratio_to_required <= {TARGET_REQUIRED}"
                row["meets_target"] = over <= TARGET_REQUIRED
            rows.append(row)
        fresh = next(r for r in rows if r["model"] == model and r["variant"] == "K=5")
        grown = next(r for r in rows if r["model"] == model and r["variant"] == "grown 5x")
        grown["ratio_to_fresh"] = grown["peak_mb"] / fresh["peak_mb"]
        print(f"  {model}, batch {batch}: done", flush=True)
    elapsed = time.perf_counter() - t0
    print()
    head = (f"{'model':<22} {'batch':>5} {'variant':<9} {'params':>9} {'peak MB':>8} "
            f"{'x plain':>8} {'required MB':>11} {'x required':>10}  target")
    print(head)
    print("-" * len(head))
    for r in rows:
        mark = "" if "meets_target" not in r else ("ok" if r["meets_target"] else "MISS")
        fresh = f"  (x fresh K=5: {r['ratio_to_fresh']:.3f})" if "ratio_to_fresh" in r else ""
        print(f"{r['model']:<22} {r['batch']:>5} {r['variant']:<9} {r['params']:>9,} "
              f"{r['peak_mb']:>8.1f} {r['ratio_to_plain']:>7.3f}x {r['required_mb']:>11.1f} "
              f"{r['ratio_to_required']:>9.3f}x  {mark}{fresh}")
    result = {
        "benchmark": "memory", "device": args.device, "python": sys.version.split()[0],
        "platform": platform.platform(), "repeats": args.repeats, "steps": STEPS,
        "load_average": list(os.getloadavg()), "seconds": elapsed,
        "targets": {"k0_ratio_max": TARGET_K0, "ratio_to_required_max": TARGET_REQUIRED},
        "formula": "required = plain + 4*(P_K - P_plain)*(2 + 1) + 4*K*sum(numel(wrapped "
                   "layer outputs)); SGD with momentum (1 slot), float32",
        "all_met": all(r.get("meets_target", True) for r in rows),
        "rows": rows,
    }
    try:
        import torch
        result["torch"] = torch.__version__
        if args.device == "cuda":
            result["device_name"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nTook {elapsed:.0f} s; wrote {out}")
    return 0


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


if __name__ == "__main__":
    raise SystemExit(main())
