"""Real-size models: ResNet-18 at 224x224 (batch 8) and GPT-2 small at sequence 128 (batch 2).

For K = 0 and 1 dendrite sets on every layer ``perforate`` wraps (GPT-2: its Conv1D
layers; the tied ``lm_head`` is left alone), this measures, on the CPU with a fixed number
of threads:

* the training step (forward, backward, SGD step with momentum) over the plain model's,
  against the FLOP ideal of ``benchmarks/overhead.py`` (counted matmul/conv FLOPs of the
  variant over the plain model's, ``1 + K*f`` with ``f`` the wrapped FLOP fraction) and its
  targets (K = 0 at most 1.03x, K = 1 at most 1.10x the ideal). Plain and perforated steps
  are interleaved in rounds and the median of the per-round ratios is reported;
* the peak training memory over the plain model's, and against the formula of
  ``benchmarks/memory.py`` (each configuration in a fresh process; target at most 1.10x);
* the inference time of ``perfora.export(model)`` (K = 1) over the plain model's.

ResNet-18 comes from torchvision when it imports, else from transformers' ``ResNetConfig``
with ResNet-18's sizes (basic blocks, depths 2-2-2-2, widths 64-512; the same layers).

    python benchmarks/zoo.py                 # several minutes
    python benchmarks/zoo.py --quick         # tiny sizes, seconds (the unit test runs it)
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import output_paths  # noqa: E402
from memory import required_extra  # noqa: E402
from overhead import TARGET_IDEAL, TARGET_K0  # noqa: E402
from rss import MALLOC_ENV, peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402

import perfora  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET_MEMORY = 1.10
KS = (0, 1)
MEMORY_STEPS = 2


# ---------------------------------------------------------------------- models
def _resnet18(quick: bool) -> tuple[nn.Module, str]:
    if not quick:
        try:
            import torchvision.models as tvm
            return tvm.resnet18(weights=None), "torchvision resnet18"
        except Exception:  # noqa: BLE001 - absent, or built for another torch
            pass
    from transformers import ResNetConfig, ResNetForImageClassification
    sizes = ([8, 16], [1, 1]) if quick else ([64, 128, 256, 512], [2, 2, 2, 2])
    model = ResNetForImageClassification(ResNetConfig(
        embedding_size=sizes[0][0], hidden_sizes=sizes[0], depths=sizes[1],
        layer_type="basic", num_labels=1000))
    return model, "transformers ResNetConfig (ResNet-18 sizes)" if not quick else "tiny"


def _gpt2(quick: bool) -> tuple[nn.Module, str]:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = (GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
           if quick else GPT2Config())
    return GPT2LMHeadModel(cfg), "transformers GPT2Config() (124M)" if not quick else "tiny"


def setup(name: str, quick: bool) -> dict[str, Any]:
    """The model (seeded), a batch, its loss and the perforate arguments."""
    torch.manual_seed(0)
    if name == "resnet18":
        model, source = _resnet18(quick)
        batch, size = (2, 32) if quick else (8, 224)
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, 1000, (batch,))

        def loss(m: nn.Module) -> torch.Tensor:
            out = m(x)
            return nn.functional.cross_entropy(getattr(out, "logits", out), y)

        return {"model": model, "source": source, "shape": f"{batch}x3x{size}x{size}",
                "loss": loss, "infer": lambda m: m(x), "perforate": {}, "x": x}
    model, source = _gpt2(quick)
    batch, seq = (2, 16) if quick else (2, 128)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    return {"model": model, "source": source, "shape": f"{batch}x{seq} tokens",
            "loss": lambda m: m(input_ids=ids, labels=ids).loss,
            "infer": lambda m: m(input_ids=ids).logits,
            "perforate": {"names": ["Conv1D"], "neuron_axes": {"Conv1D": -1},
                          "example_input": ids[:1]}, "x": ids}


def grown(plain: nn.Module, kwargs: dict, k: int) -> nn.Module:
    """A perforated copy with K sets per layer, v and cascade random (every term live), as
    ``benchmarks/overhead.py`` builds its variants."""
    model = perfora.perforate(copy.deepcopy(plain), **kwargs)
    gen = torch.Generator().manual_seed(7)
    for i, layer in enumerate(perfora.dendritic_layers(model).values()):
        for j in range(k):
            layer.grow(torch.Generator().manual_seed(1000 + 10 * i + j))
        with torch.no_grad():
            for p in (layer.out_weight, layer.cascade):
                if p is not None:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def step_flops(model: nn.Module, loss: Callable[[nn.Module], torch.Tensor]) -> int:
    """Matmul/conv FLOPs of one forward+backward (overhead.py's count, any loss)."""
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        loss(model).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


# ---------------------------------------------------------------------- timing
def _train_step(model: nn.Module, opt: torch.optim.Optimizer, loss) -> None:
    opt.zero_grad(set_to_none=True)
    loss(model).backward()
    opt.step()


def time_rounds(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int) -> dict:
    """Interleave the variants round-robin; per variant the median per-round ratio to
    ``plain`` and the median seconds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    seconds: dict[str, list[float]] = {v: [] for v in fns}
    for i in range(rounds):
        for v, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            seconds[v].append(time.perf_counter() - t0)
        _progress(f"round {i + 1}/{rounds}: " + ", ".join(
            f"{v} {s[-1]:.2f} s" for v, s in seconds.items()))
    out = {}
    for v, s in seconds.items():
        ratios = [a / b for a, b in zip(s, seconds["plain"])]
        out[v] = {"seconds": statistics.median(s), "ratio": statistics.median(ratios)}
    return out


def time_model(name: str, quick: bool, rounds: int) -> dict[str, Any]:
    s = setup(name, quick)
    plain = s["model"].train()
    variants = {"plain": plain, **{f"K={k}": grown(plain, s["perforate"], k).train()
                                   for k in KS}}
    flops = {v: step_flops(m, s["loss"]) for v, m in variants.items()}
    opts = {v: torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)
            for v, m in variants.items()}
    train = time_rounds({v: (lambda v=v: _train_step(variants[v], opts[v], s["loss"]))
                         for v in variants}, rounds, warmup=1)
    exported = perfora.export(variants["K=1"]).eval()
    plain.eval()
    with torch.no_grad():
        infer = time_rounds({"plain": lambda: s["infer"](plain),
                             "export K=1": lambda: s["infer"](exported)},
                            rounds, warmup=1)
    wrapped = perfora.describe(variants["K=0"]).wrapped
    rows = {}
    for k in KS:
        v = f"K={k}"
        ideal = flops[v] / flops["plain"]
        ratio = train[v]["ratio"]
        target = TARGET_K0 if k == 0 else TARGET_IDEAL
        rows[v] = {"step_s": train[v]["seconds"], "ratio": ratio, "ideal": ideal,
                   "ratio_over_ideal": ratio / ideal, "target": target,
                   "met": (ratio if k == 0 else ratio / ideal) <= target}
    return {"model": name, "source": s["source"], "input": s["shape"],
            "wrapped_layers": len(wrapped),
            "wrapped_flop_fraction": (flops["K=1"] - flops["plain"]) / flops["plain"],
            "plain_step_s": train["plain"]["seconds"], "train": rows,
            "export_inference": {"plain_s": infer["plain"]["seconds"],
                                 "export_s": infer["export K=1"]["seconds"],
                                 "ratio": infer["export K=1"]["ratio"]}}


# ---------------------------------------------------------------------- memory (child)
def memory_child(spec: dict) -> dict:
    """Peak training RSS of one (model, variant) in this fresh process."""
    torch.set_num_threads(spec["threads"])
    s = setup(spec["model"], spec["quick"])
    plain = s.pop("model").train()  # only `plain` holds it: a grown copy frees it below
    warm = copy.deepcopy(plain)
    s["loss"](warm).backward()
    del warm
    base = rss_bytes()  # with the plain weights: each variant's peak counts only its extra
    plain_params = sum(p.numel() for p in plain.parameters())
    k = spec["k"]
    outputs: dict[str, int] = {}
    if k is None:
        model, k_used = plain, 0
    else:
        model, k_used = grown(plain, s["perforate"], k).train(), k
        del plain  # its weights go back to the system (MALLOC_ENV): not counted twice
        gc.collect()
        hooks = [layer.register_forward_hook(
            lambda m, i, o, p=path: outputs.__setitem__(p, o.numel()))
            for path, layer in perfora.dendritic_layers(model).items()]
        with torch.no_grad():
            s["infer"](model)
        for h in hooks:
            h.remove()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    _train_step(model, opt, s["loss"])
    reset_peak_rss()
    for _ in range(MEMORY_STEPS):
        _train_step(model, opt, s["loss"])
    return {"peak_bytes": peak_rss_bytes() - base, "K": k_used,
            "params": sum(p.numel() for p in model.parameters()),
            "plain_params": plain_params, "wrapped_output_numel": sum(outputs.values())}


def run_memory_child(spec: dict) -> dict:
    if spec["quick"]:  # a smoke run: in this process (its peak is not a clean measurement)
        return memory_child(spec)
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        raise SystemExit(f"child {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(value: float, reference: float) -> float:
    """value / reference; NaN where the reference is zero (a tiny --quick model can peak
    within the allocator's slack, so its measured extra memory is 0 bytes)."""
    return value / reference if reference > 0 else float("nan")


def memory_model(name: str, quick: bool, threads: int) -> dict[str, Any]:
    spec = {"model": name, "quick": quick, "threads": threads}
    plain = run_memory_child({**spec, "k": None})
    rows = {}
    for k in KS:
        r = run_memory_child({**spec, "k": k})
        required = plain["peak_bytes"] + required_extra(r)
        rows[f"K={k}"] = {"peak_bytes": r["peak_bytes"],
                          "over_plain": _ratio(r["peak_bytes"], plain["peak_bytes"]),
                          "formula_bytes": required,
                          "over_formula": _ratio(r["peak_bytes"], required),
                          "met": _ratio(r["peak_bytes"], required) <= TARGET_MEMORY}
    return {"plain_peak_bytes": plain["peak_bytes"], "variants": rows}


# ---------------------------------------------------------------------- output
def print_table(results: list[dict], threads: int) -> None:
    print(f"threads: {threads} (torch.set_num_threads); step = forward + backward + SGD")
    print(f"{'model':<10} {'K':<4} {'step ratio':>10} {'ideal':>6} {'ratio/ideal':>11} "
          f"{'target':>7} {'mem/plain':>9} {'mem/formula':>11} {'export inf':>10}")
    for r in results:
        for k in KS:
            v = f"K={k}"
            t, m = r["train"][v], r["memory"]["variants"][v]
            target = f"{'<=' if k else 'ratio<='}{t['target']}"
            exp = f"{r['export_inference']['ratio']:.3f}x" if k == 1 else ""
            print(f"{r['model']:<10} {k:<4} {t['ratio']:>9.3f}x {t['ideal']:>5.2f}x "
                  f"{t['ratio_over_ideal']:>11.3f} {target:>7}{'' if t['met'] else '!'} "
                  f"{m['over_plain']:>8.3f}x {m['over_formula']:>10.3f}x {exp:>10}")


def markdown_table(data: dict[str, Any]) -> str:
    """The docs/zoo.md table of a stored run (``--markdown results/zoo.json``)."""
    lines = ["| model | K | step (s) | step / plain | FLOP ideal | / ideal (target) "
             "| peak MiB | peak / plain | peak / formula | export inference / plain |",
             "|" + "---|" * 10]
    for r in data["results"]:
        mem = r["memory"]
        lines.append(f"| {r['model']} | plain | {r['plain_step_s']:.2f} | 1 | 1 | | "
                     f"{mem['plain_peak_bytes'] / 2**20:.0f} | 1 | | 1 |")
        for k in KS:
            t, m = r["train"][f"K={k}"], mem["variants"][f"K={k}"]
            over = t["ratio"] if k == 0 else t["ratio_over_ideal"]
            target = f"{over:.3f} ({'ratio ' if k == 0 else ''}<= {t['target']}"
            target += ", met)" if t["met"] else ", missed)"
            exp = f"{r['export_inference']['ratio']:.2f}x" if k == 1 else ""
            lines.append(f"| {r['model']} | {k} | {t['step_s']:.2f} | {t['ratio']:.3f}x | "
                         f"{t['ideal']:.2f}x | {target} | {m['peak_bytes'] / 2**20:.0f} | "
                         f"{m['over_plain']:.3f}x | {m['over_formula']:.3f}x | {exp} |")
    return "\n".join(lines)


def _progress(message: str) -> None:
    """A progress line on stderr (a real-size run takes many minutes)."""
    print(f"[zoo {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--markdown", type=Path, metavar="JSON",
                    help="print the docs/zoo.md table of a stored run and exit")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, seconds (a smoke run)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default 7; 2 "
                                                             "with --quick)")
    ap.add_argument("--models", default="resnet18,gpt2")
    ap.add_argument("--out", type=Path, default=None,
                    help=output_paths.default_help("zoo.json, zoo_quick.json for --quick"))
    output_paths.add_update_stored(ap)
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    name = "zoo_quick.json" if args.quick else "zoo.json"
    return output_paths.output_file(args, name, "out")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(memory_child(json.loads(args.child))))
        return 0
    if args.markdown:
        print(markdown_table(json.loads(args.markdown.read_text())))
        return 0
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (2 if args.quick else 7)
    out = output_path(args)
    results = []
    for name in args.models.split(","):
        _progress(f"{name}: timing {rounds} rounds")
        r = time_model(name, args.quick, rounds)
        _progress(f"{name}: memory (a fresh process per variant)")
        r["memory"] = memory_model(name, args.quick, args.threads)
        results.append(r)
    print_table(results, args.threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "zoo", "quick": args.quick, "threads": args.threads, "rounds": rounds,
        "torch": torch.__version__, "machine": platform.machine(),
        "load_average": os.getloadavg(), "targets": {
            "K=0 step ratio": TARGET_K0, "K=1 step ratio / ideal": TARGET_IDEAL,
            "memory / formula": TARGET_MEMORY},
        "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
