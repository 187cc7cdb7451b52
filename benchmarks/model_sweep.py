"""Model sweep: many real architectures through perfora, stage by stage, to find what breaks.

For each model (torchvision's and timm's where they import, Hugging Face models built from tiny
configs (``hf:NAME``, :mod:`hf_models`) where transformers imports, plus a few built from
``torch.nn`` alone, so the sweep runs anywhere): ``perforate``; two dendrite sets per layer
with the output unchanged; two training steps with the sets fed, the loss finite; the export
equal to the live model; and every layer ``plan_widening`` finds widened with the output
unchanged. Each stage is recorded as ok or with its error, so one failure does not hide the
next model's. Prints a table and writes ``model_sweep.json``.

    python benchmarks/model_sweep.py [--device cuda] [--models resnet18,timm:vit_tiny_...]
    python benchmarks/model_sweep.py --models hf        # every Hugging Face model
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import hf_models
import output_paths
import torch
from torch import nn

import perfora

TORCHVISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
               "convnext_tiny", "regnet_x_400mf", "shufflenet_v2_x0_5", "squeezenet1_0",
               "densenet121", "vgg11_bn", "alexnet", "mnasnet0_5", "swin_t", "googlenet"]
TIMM = ["resnet18", "efficientnet_b0", "convnext_atto", "vit_tiny_patch16_224",
        "deit_tiny_patch16_224", "mobilevit_xxs", "regnetx_002", "mixer_s16_224",
        "levit_128s", "coat_lite_tiny", "poolformer_s12", "ghostnet_100", "edgenext_xx_small",
        "efficientformer_l1", "fastvit_t8"]
TORCH_NN = ["mlp", "cnn_bn", "transformer_encoder"]


def _torch_nn(name: str) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 64), nn.ReLU(inplace=True),
                             nn.Linear(64, 3))
    if name == "cnn_bn":
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16),
                             nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, padding=1),
                             nn.Hardswish(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 3))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, 32, 16, stride=16)
            layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            tokens = self.embed(x).flatten(2).transpose(1, 2)
            return self.head(self.encoder(tokens).mean(1))

    return Encoder()


def check_spec(spec: str) -> None:
    """Refuse a model name the sweep does not know, before anything runs."""
    source, _, name = spec.rpartition(":")
    known = source == "timm" and name or source in ("", "tv") and name in TORCHVISION \
        or source == "" and name in TORCH_NN or source == "hf" and name in _hf_names()
    if not known:
        hf = ", ".join(_hf_names()) or "transformers does not import here"
        raise SystemExit(f"unknown model {spec!r}: torchvision names ({', '.join(TORCHVISION)}"
                         f"), timm:NAME, hf:NAME ({hf}), or {', '.join(TORCH_NN)}")


def _hf_names() -> list[str]:
    try:
        return list(hf_models.hf_models())
    except ImportError:
        return []


class Subject(NamedTuple):
    """What the sweep needs of a model: how to build it, run it on its batch (the output
    tensor), and a training loss from that output."""
    build: Callable[[], nn.Module]
    run: Callable[[nn.Module], torch.Tensor]
    loss: Callable[[torch.Tensor], torch.Tensor]


def builder(spec: str, device: torch.device) -> Subject:
    """A model constructor (3 classes, no pretrained weights; a Hugging Face base model for
    ``hf:``), its forward on one batch, and a loss."""
    source, _, name = spec.rpartition(":")
    if source == "hf":
        build, make_inputs = hf_models.hf_models()[name]
        inputs = {k: v.to(device) for k, v in make_inputs().items()}
        return Subject(build, lambda m: m(**inputs).last_hidden_state,
                       lambda out: out.square().mean())
    size = 64
    if source == "timm":
        import timm

        build, size = (lambda: timm.create_model(name, pretrained=False, num_classes=3)), 224
    elif source in ("", "tv") and name in TORCHVISION:
        import torchvision.models as tvm

        extra = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
        build, size = (lambda: getattr(tvm, name)(weights=None, num_classes=3, **extra)), 96
    else:
        build = functools.partial(_torch_nn, name)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)
    y = torch.tensor([0, 2], device=device)
    return Subject(build, lambda m: _logits(m(x)),
                   lambda out: nn.functional.cross_entropy(out, y))


def available_models() -> list[str]:
    """Every model of the sweep whose library imports here."""
    specs = list(TORCH_NN)
    try:
        import torchvision.models  # noqa: F401
        specs += [f"tv:{n}" for n in TORCHVISION]
    except Exception as exc:  # a wheel built for another torch fails with RuntimeError
        print(f"torchvision left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        import timm  # noqa: F401
        specs += [f"timm:{n}" for n in TIMM]
    except Exception as exc:
        print(f"timm left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    names = _hf_names()
    if not names:
        print("Hugging Face models left out: transformers does not import", file=sys.stderr)
    return specs + [f"hf:{n}" for n in names]


def _logits(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def sweep_one(spec: str, device: torch.device) -> dict:
    """The stages for one model: each 'ok', a measurement, or the error that stopped it."""
    row: dict = {"model": spec}
    stage = "build"
    try:
        build, run, loss_of = builder(spec, device)  # an import that fails is this model's error
        torch.manual_seed(0)
        model = perfora.perforate(build().eval()).to(device)
        row["wrapped"] = dict(collections.Counter(w.type for w in
                                                  perfora.describe(model).wrapped))
        stage = "grow"
        with torch.no_grad():
            before = run(model)
        layers = perfora.dendritic_layers(model)
        for layer in layers.values():
            for seed in (1, 2):
                layer.grow(torch.Generator().manual_seed(seed))
        with torch.no_grad():
            row["grow_output_change"] = (run(model) - before).abs().max().item()
            for layer in layers.values():
                layer.out_weight.fill_(0.01)
        stage = "train"
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            loss = loss_of(run(model))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        row["loss_finite"] = all(torch.isfinite(torch.tensor(losses)).tolist())
        stage = "export"
        model.eval()
        with torch.no_grad():
            live = run(model)
            exported = perfora.export(model)
            row["export_diff"] = (run(exported) - live).abs().max().item()
        stage = "widen"
        torch.manual_seed(0)
        fresh = perfora.perforate(build().eval()).to(device)
        plan = perfora.plan_widening(fresh)
        row["widenable"] = f"{len(plan.widenable)}/{len(plan.layers)}"
        with torch.no_grad():
            before = run(fresh)
            for path in plan.widenable:
                perfora.widen(fresh, path, 2)
            row["widen_output_change"] = (run(fresh) - before).abs().max().item()
        stage = "done"
    except Exception as exc:  # recorded per model: the sweep goes on
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["where"] = traceback.format_exc().strip().splitlines()[-3:-1]
    row["stage"] = stage
    return row


def table(rows: list[dict]) -> str:
    """The sweep as a markdown table."""
    lines = ["| model | wrapped | grow | train | export diff | widenable | widen | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wrapped = ", ".join(f"{v} {k}" for k, v in r.get("wrapped", {}).items())
        lines.append(f"| {r['model']} | {wrapped} | {r.get('grow_output_change', '')} | "
                     f"{r.get('loss_finite', '')} | {r.get('export_diff', '')} | "
                     f"{r.get('widenable', '')} | {r.get('widen_output_change', '')} | "
                     f"{r.get('error', '')[:120]} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default=None,
                    help="comma-separated (default: every model whose library imports); 'hf' "
                         "for every Hugging Face model")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON output path (default benchmarks/results/local/model_sweep.json; "
                         "the stored results/model_sweep_h200.json is a GPU machine's run, "
                         "copied by hand)")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """--out, else benchmarks/results/local/model_sweep.json (git-ignored)."""
    return args.out or output_paths.LOCAL / "model_sweep.json"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.out = output_path(args)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True  # growth must leave outputs bit-identical
        torch.backends.cudnn.benchmark = False
    specs = args.models.split(",") if args.models else available_models()
    if specs == ["hf"]:
        specs = [f"hf:{n}" for n in _hf_names()]
        if not specs:
            raise SystemExit("--models hf: transformers does not import here; "
                             "pip install transformers")
    for spec in specs:
        check_spec(spec)
    rows = []
    for spec in specs:
        start = time.perf_counter()
        rows.append(sweep_one(spec, device))
        rows[-1]["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(rows[-1], default=str), flush=True)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                    "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
