"""Inference time of exported grown models against the plain model and the FLOP ideal.

For an MLP 64-256-256-10 at batch 256 and a small CNN at batch 32, this builds the plain
model, perforates a copy, grows K = 0..3 dendrites in every layer (full sets), and times one
forward pass under ``torch.inference_mode`` of: the plain model, the live perforated model,
and ``perfora.export`` of it. Every Linear/Conv is wrapped, so the FLOP ideal is K + 1 times
the plain forward. Variants are timed interleaved (each round runs all of them in a rotated
order) and the ratio is the median over rounds of ``t(variant) / t(plain)`` from the same
round, on one thread, by process CPU time.

    python benchmarks/export_speed.py              # ~1 minute
    python benchmarks/export_speed.py --quick      # smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import output_paths
import torch
from torch import nn

import perfora

KS = (0, 1, 2, 3)
OUTPUT = "export_speed.json"


def make_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def make_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(64, 10))


CASES = {"mlp-64-256-256-10 b256": (make_mlp, lambda: torch.randn(256, 64)),
         "cnn-32x32 b32": (make_cnn, lambda: torch.randn(32, 3, 32, 32))}


def grown(build, k: int) -> nn.Module:
    """A perforated copy with k full dendrite sets in every layer, v and w rows nonzero."""
    torch.manual_seed(0)
    model = perfora.perforate(build())
    generator = torch.Generator().manual_seed(0)
    for _ in range(k):
        for layer in perfora.dendritic_layers(model).values():
            layer.grow(generator)
    with torch.no_grad():
        for layer in perfora.dendritic_layers(model).values():
            for p in layer.group_parameters("out") + layer.group_parameters("cascade"):
                p.fill_(0.1)
    return model.eval()


def time_round(variants: dict[str, nn.Module], x: torch.Tensor, rotation: int,
               repeats: int) -> dict[str, float]:
    """One round: every variant runs ``repeats`` forwards; returns CPU seconds per forward."""
    names = list(variants)
    names = names[rotation % len(names):] + names[:rotation % len(names)]
    out: dict[str, float] = {}
    with torch.inference_mode():
        for name in names:
            model = variants[name]
            model(x)
            start = time.process_time()
            for _ in range(repeats):
                model(x)
            out[name] = (time.process_time() - start) / repeats
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 repeats")
    output_paths.add_output_options(parser, OUTPUT, "--out")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "out")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rounds, repeats = (3, 5) if args.quick else (args.rounds, args.repeats)
    torch.set_num_threads(1)
    rows = []
    for case, (build, data) in CASES.items():
        x = data()
        variants: dict[str, nn.Module] = {"plain": build().eval()}
        for k in KS:
            live = grown(build, k)
            variants[f"live K={k}"] = live
            variants[f"export K={k}"] = perfora.export(live)
        ratios: dict[str, list[float]] = {name: [] for name in variants if name != "plain"}
        for r in range(rounds):
            times = time_round(variants, x, r, repeats)
            for name in ratios:
                ratios[name].append(times[name] / times["plain"])
        for k in KS:
            live = statistics.median(ratios[f"live K={k}"])
            exported = statistics.median(ratios[f"export K={k}"])
            rows.append({"case": case, "K": k, "ideal": k + 1, "live": live,
                         "export": exported, "export_over_ideal": exported / (k + 1)})
    print(f"{'case':<24} {'K':>2} {'ideal':>6} {'live':>7} {'export':>7} {'export/ideal':>13}")
    for row in rows:
        print(f"{row['case']:<24} {row['K']:>2} {row['ideal']:>6.2f} {row['live']:>7.2f} "
              f"{row['export']:>7.2f} {row['export_over_ideal']:>13.2f}")
    out = output_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "torch": torch.__version__, "machine": platform.machine(), "threads": 1,
        "rounds": rounds, "repeats": repeats, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
