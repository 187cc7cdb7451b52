"""GPU check: growth on CUDA, DDP/FSDP2 restructures over NCCL, Lightning strategies on a GPU.

Run on a machine with one CUDA device: ``python benchmarks/gpu_check.py [--out DIR]``. Prints a
table of checks and writes ``gpu_check.json`` (in ``results/local/gpu_check/``, git-ignored,
without ``--out``). Not part of the test suite (CI has no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import output_paths
import torch
from torch import nn

import perfora

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn, repeats: int = 30) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def growth_on_cuda() -> dict:
    """Outputs unchanged by growth on CUDA (MLP, Conv2d), bf16 autocast, step-time ratios."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    out: dict = {}
    for name, build, shape in (
        ("mlp", lambda: nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)),
         (64, 256)),
        ("conv", lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                       nn.Flatten(), nn.Linear(16 * 8 * 8, 10)), (16, 3, 8, 8)),
    ):
        model = perfora.perforate(build()).to(dev)
        ctl = perfora.GrowthController(model, write_files=False)
        ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
        opt, _ = ctl.build_optimizer()
        x = torch.randn(*shape, device=dev)
        for _ in range(5):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        diffs = []
        for _ in range(2):
            with torch.no_grad():
                before = model(x)
            decision = ctl.add_dendrites()
            with torch.no_grad():
                after = decision.model(x)
            diffs.append((after - before).abs().max().item())
            opt = decision.optimizer
            opt.zero_grad()
            decision.model(x).square().mean().backward()
            opt.step()
        on_cuda = all(p.is_cuda for p in model.parameters())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        y.float().square().mean().backward()
        finite = all(torch.isfinite(p.grad).all().item() for p in model.parameters()
                     if p.grad is not None)
        out[name] = {"growth_output_change": max(diffs), "params_on_cuda": on_cuda,
                     "bf16_autocast_dtype": str(y.dtype), "bf16_grads_finite": finite}
    # step time of a wide MLP: plain vs perforated with K = 0, 1, 2 (side by side)
    width, batch = 2048, 4096
    x = torch.randn(batch, width, device=dev)
    times = {}
    plain = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(dev)
    models = {"plain": plain}
    for k in (0, 1, 2):
        torch.manual_seed(0)
        m = perfora.perforate(nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                            nn.Linear(width, width))).to(dev)
        ctl = perfora.GrowthController(m, write_files=False)
        for _ in range(k):
            ctl.add_dendrites()
        models[f"K={k}"] = m
    for name, m in models.items():
        opt = torch.optim.Adam(m.parameters(), lr=1e-4)

        def step(m=m, opt=opt):
            opt.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
            opt.step()

        times[name] = _timed(step)
    out["step_ms"] = {k: round(v * 1e3, 3) for k, v in times.items()}
    out["step_ratio_vs_plain"] = {k: round(v / times["plain"], 3) for k, v in times.items()}
    return out


def nccl_restructures() -> dict:
    """World size 1 over NCCL: DDP re-wrap and FSDP2 re-shard on CUDA, checkpoint round trip."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    res: dict = {}
    try:
        torch.manual_seed(0)
        model = perfora.perforate(nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                nn.Linear(64, 5))).to(dev)
        ddp = perfora.wrap_ddp(model, device_ids=[0])
        ctl = perfora.GrowthController(ddp, write_files=False)
        ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
        opt, _ = ctl.build_optimizer()
        x = torch.randn(16, 32, device=dev)
        opt.zero_grad()
        ddp(x).sum().backward()
        opt.step()
        decision = ctl.add_dendrites()
        new = decision.model
        decision.optimizer.zero_grad()
        new(x).sum().backward()
        decision.optimizer.step()
        res["ddp"] = {"rewrapped": isinstance(new, nn.parallel.DistributedDataParallel)
                      and new is not ddp, "dendrites": ctl.num_dendrites,
                      "on_cuda": all(p.is_cuda for p in new.parameters())}

        mesh = init_device_mesh("cuda", (1,))
        torch.manual_seed(0)
        plain = perfora.perforate(nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                nn.Linear(64, 5))).to(dev)
        sharded = perfora.shard_fsdp2(plain, mesh=mesh)
        ctl2 = perfora.GrowthController(sharded, write_files=False)
        ctl2.set_optimizer(torch.optim.Adam, lr=1e-3)
        opt2, _ = ctl2.build_optimizer()
        opt2.zero_grad()
        sharded(x).sum().backward()
        opt2.step()
        with torch.no_grad():
            before = sharded(x)
        d2 = ctl2.add_dendrites()
        with torch.no_grad():
            after = d2.model(x)
        d2.optimizer.zero_grad()
        d2.model(x).sum().backward()
        d2.optimizer.step()
        path = Path(os.environ.get("PERFORA_GPU_TMP", "/tmp")) / "fsdp2_gpu.safetensors"
        ctl2.save(path)
        ctl3 = perfora.GrowthController(
            perfora.shard_fsdp2(perfora.perforate(nn.Sequential(
                nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))).to(dev), mesh=mesh),
            write_files=False)
        ctl3.set_optimizer(torch.optim.Adam, lr=1e-3)
        d3 = ctl3.load(path)
        with torch.no_grad():
            same = (d3.model(x) - d2.model(x)).abs().max().item()
        res["fsdp2"] = {"growth_output_change": (after - before).abs().max().item(),
                        "dendrites": ctl2.num_dendrites,
                        "on_cuda": all(p.is_cuda for p in d2.model.parameters()),
                        "resumed_output_diff": same,
                        "optimizer_state_restored": bool(d3.optimizer.state)}
    except Exception as exc:  # report, do not hide
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()
    return res


def lightning_runs(out: Path) -> dict:
    """Real Trainer(accelerator='gpu', devices=1) fits through the test script."""
    script = ROOT / "tests" / "scripts" / "lightning" / "run_digits.py"
    runs = {
        "ddp_bf16": ["--strategy", "ddp", "--precision", "bf16-mixed"],
        "model_parallel": ["--strategy", "model_parallel"],
        "single_accumulate": ["--strategy", "auto", "--accumulate", "2"],
        "fsdp1": ["--strategy", "fsdp"],
    }
    res: dict = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUBLAS_WORKSPACE_CONFIG=":4096:8")
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # left by the NCCL check: Lightning picks its own
        env.pop(name, None)
    for name, extra in runs.items():
        run_dir = out / name
        cmd = [sys.executable, str(script), "--out", str(run_dir), "--accelerator", "gpu",
               "--devices", "1", "--max-epochs", "8", *extra]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        entry: dict = {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1)}
        rec = run_dir / "rank0.pt"
        if rec.exists():
            data = torch.load(rec, weights_only=True)
            entry.update({k: data[k] for k in ("num_dendrites", "events", "completed")})
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln]
            entry["error"] = lines[-1][:400] if lines else proc.stderr[-400:]
        res[name] = entry
    return res


def _fit(out: Path, name: str, *extra: str) -> dict:
    """One Lightning fit of the test script on one GPU; its rank-0 record, or the error."""
    script = ROOT / "tests" / "scripts" / "lightning" / "run_digits.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), CUBLAS_WORKSPACE_CONFIG=":4096:8")
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, str(script), "--out", str(out / name), "--accelerator", "gpu",
           "--devices", "1", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    entry: dict = {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1)}
    rec = out / name / "rank0.pt"
    if rec.exists():
        entry["record"] = torch.load(rec, weights_only=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln]
        entry["error"] = lines[-1][:400] if lines else proc.stderr[-600:]
    return entry


def _summary(entry: dict) -> dict:
    rec = entry.get("record") or {}
    return {k: v for k, v in entry.items() if k != "record"} | {
        k: rec.get(k) for k in ("num_dendrites", "events", "global_step")}


def _diff(a: dict, b: dict) -> float | None:
    if "record" not in a or "record" not in b:
        return None
    def clean(params: dict) -> dict:  # FSDP1 names carry its wrapper's prefix
        return {k.replace("_fsdp_wrapped_module.", ""): v for k, v in params.items()}

    pa, pb = clean(a["record"]["params"]), clean(b["record"]["params"])
    if pa.keys() != pb.keys():
        return None
    return max((pa[k] - pb[k]).abs().max().item() for k in pa)


def _grow_resume_compare(out: Path, prefix: str, strategy: str) -> dict:
    """Growth to completion, a run stopped after the first growth step and resumed, ddp."""
    full = _fit(out, f"{prefix}_full", "--strategy", strategy, "--max-epochs", "12",
                "--save-last")
    first = _fit(out, f"{prefix}_first", "--strategy", strategy, "--max-epochs", "3",
                 "--save-last")
    resumed = _fit(out, f"{prefix}_resumed", "--strategy", strategy, "--max-epochs", "12",
                   "--ckpt-path", str(out / f"{prefix}_first" / "ckpt" / "last.ckpt"))
    ddp = _fit(out, "ddp_full", "--strategy", "ddp", "--max-epochs", "12")
    return {"full": _summary(full), "first": _summary(first), "resumed": _summary(resumed),
            "resumed_vs_full_max_diff": _diff(resumed, full), "ddp": _summary(ddp),
            f"{prefix}_vs_ddp_max_diff": _diff(full, ddp)}


def deepspeed_runs(out: Path) -> dict:
    """DeepSpeed ZeRO-2 under Lightning: growth, resume after a growth step, ZeRO-3 refusal."""
    report = _grow_resume_compare(out, "deepspeed", "deepspeed_stage_2")
    report["stage3"] = _summary(_fit(out, "ds_stage3", "--strategy", "deepspeed_stage_3",
                                     "--max-epochs", "1"))
    return report


def deepspeed_zero3(out: Path) -> dict:
    """perfora.wrap_deepspeed with ZeRO-3 over NCCL (world size 1): growth one layer at a time
    (outputs unchanged), a new engine, training after growth, checkpoint into a plain model."""
    import deepspeed
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29537", RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    res: dict = {"deepspeed": deepspeed.__version__}

    def make() -> nn.Module:
        torch.manual_seed(0)
        return perfora.perforate(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5)))

    try:
        config = {"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 3},
                  "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
        engine = perfora.wrap_deepspeed(make(), config, optimizer=torch.optim.Adam,
                                        optimizer_args={"lr": 1e-3})
        ctl = perfora.GrowthController(engine, write_files=False)
        x = torch.randn(16, 32, device=dev)
        engine.backward(engine(x).sum())
        engine.step()
        with torch.no_grad():
            before = engine(x)
        decision = ctl.add_dendrites()
        new = decision.model
        with torch.no_grad():
            after = new(x)
        new.backward(new(x).sum())
        new.step()
        path = out / "deepspeed_zero3.safetensors"
        ctl.save(path)
        plain = perfora.load_model(make(), path).to(dev)
        with torch.no_grad():
            reloaded = (plain(x) - new(x)).abs().max().item()
        res.update({"growth_output_change": (after - before).abs().max().item(),
                    "new_engine": new is not engine, "dendrites": ctl.num_dendrites,
                    "partitioned": all(hasattr(p, "ds_id") for p in new.module.parameters()),
                    "on_cuda": all(p.ds_tensor.is_cuda for p in new.module.parameters()),
                    "reloaded_output_diff": reloaded,
                    "peak_mib": torch.cuda.max_memory_allocated() / 2**20})
    except Exception as exc:  # report, do not hide
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()
    return res


def fsdp1_runs(out: Path) -> dict:
    """Lightning's FSDPStrategy (FSDP1) with perfora.wrap_fsdp1: growth, resume, vs ddp."""
    return _grow_resume_compare(out, "fsdp1", "fsdp1")


def error_growth() -> dict:
    """Error-driven, selective growth on CUDA under DDP and FSDP2 over NCCL (world size 1):
    the probe records CUDA activations, plans come from NCCL-reduced moments, outputs stay
    unchanged at growth; and the time one plan takes for a 2048-wide layer."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29534"
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    res: dict = {}
    try:
        for kind in ("ddp_mlp", "ddp_conv", "fsdp2_mlp"):
            torch.manual_seed(0)
            if kind == "ddp_conv":
                net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(16 * 8 * 8, 10))
                x, y = torch.randn(256, 3, 8, 8, device=dev), torch.randint(0, 10, (256,),
                                                                              device=dev)
            else:
                net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
                x, y = torch.randn(256, 32, device=dev), torch.randint(0, 10, (256,),
                                                                       device=dev)
            model = perfora.perforate(net).to(dev)
            if kind.startswith("fsdp2"):
                model = perfora.shard_fsdp2(model, mesh=init_device_mesh("cuda", (1,)))
            else:
                model = perfora.wrap_ddp(model, device_ids=[0])
            ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=2,
                                           grow_fraction=0.5, write_files=False)
            ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
            opt, _ = ctl.build_optimizer()
            changes, seconds = [], []
            for _ in range(2):
                for batch in range(4):
                    idx = slice(64 * batch, 64 * (batch + 1))
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                with torch.no_grad():
                    before = model(x[:64])
                start = time.perf_counter()
                decision = ctl.step(1.0, model=model)
                seconds.append(time.perf_counter() - start)
                model, opt = decision.model, decision.optimizer
                with torch.no_grad():
                    changes.append((model(x[:64]) - before).abs().max().item())
            layers = perfora.dendritic_layers(model)
            res[kind] = {"dendrites": ctl.num_dendrites, "output_change": max(changes),
                         "fed": {p: [len(f) for f in (m.set_neurons() or [])]
                                 for p, m in layers.items()},
                         "on_cuda": all(p.is_cuda for p in model.parameters()),
                         "step_seconds": [round(t, 3) for t in seconds]}
        from perfora.growth.candidates import plan_growth

        big = perfora.DendriticLayer(nn.Linear(2048, 2048).to(dev), num_neurons=2048,
                                     neuron_axis=-1)  # candidates train on the GPU
        rows, err = torch.randn(2048, 2048), torch.randn(2048, 2048)
        start = time.perf_counter()
        plan = plan_growth(big, rows, err, generator=torch.Generator().manual_seed(0))
        res["plan_2048_wide_seconds"] = round(time.perf_counter() - start, 2)
        res["plan_2048_wide_weight"] = list(plan.weights["weight"].shape)
    except Exception as exc:  # report, do not hide
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()
    return res


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
           y: torch.Tensor, steps: int = 4) -> None:
    """``steps`` Adam steps on 64-row slices of (x, y), then eval mode."""
    model.train()
    for i in range(steps):
        rows = slice(64 * i, 64 * (i + 1))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    model.eval()


def _exact_change(model: nn.Module, x: torch.Tensor, change) -> tuple:
    """Run ``change()`` (a restructure returning a Decision); whether the output of ``x``
    stayed bit-identical, and the decision."""
    with torch.no_grad():
        before = model(x)
    decision = change()
    with torch.no_grad():
        after = decision.model(x)
    return bool(torch.equal(after, before)), decision


def _neuron_nets(dev: torch.device) -> dict:
    """Two nets to widen on CUDA, each with its inputs and labels."""
    gen = torch.Generator(device=dev).manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.Tanh(),
                        nn.Linear(48, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(16 * 4 * 4, 10))
    return {"mlp": (mlp, torch.randn(256, 32, device=dev, generator=gen)),
            "cnn_bn": (cnn, torch.randn(256, 3, 8, 8, device=dev, generator=gen))}


def _neuron_steps(model: nn.Module, x: torch.Tensor,
                  y: torch.Tensor) -> tuple[nn.Module, torch.optim.Optimizer, Any, list, list]:
    """A GradMax neuron controller on ``model`` and two plateaus, each a new best (both
    widenings kept): (model, optimizer, controller, outputs kept bit-identical, reasons)."""
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, neuron_init="gradmax", write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    opt, _ = ctl.build_optimizer()
    exact, reasons = [], []
    for score in (0.5, 0.6):
        _epoch(model, opt, x, y)
        same, decision = _exact_change(model, x[:64], lambda s=score: ctl.step(s))
        exact.append(same)
        reasons.append(decision.reason)
        model, opt = decision.model, decision.optimizer
    return model, opt, ctl, exact, reasons


def neuron_growth() -> dict:
    """Neuron growth on CUDA: GradMax rows from the error recorded on the GPU, widenings
    exact (an MLP, a CNN with BatchNorm, then mixed with dendrites), bf16 autocast after
    them; under DDP and FSDP2 over NCCL (world size 1) with a save/load round trip; and the
    time one widening of a 2048-wide pair takes against one training step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(0)
    res: dict = {}
    for name, (net, x) in _neuron_nets(dev).items():
        torch.manual_seed(0)
        y = torch.randint(0, 10, (x.shape[0],), device=dev)
        model, opt, ctl, exact, reasons = _neuron_steps(perfora.perforate(net).to(dev), x, y)
        same, decision = _exact_change(model, x[:64], ctl.add_dendrites)  # dendrites on top
        exact.append(same)
        model, opt = decision.model, decision.optimizer
        _epoch(model, opt, x, y)
        same, decision = _exact_change(model, x[:64], ctl.add_neurons)  # widen dendritic layers
        exact.append(same)
        reasons.append(decision.reason)
        model, opt = decision.model, decision.optimizer
        _epoch(model, opt, x, y)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x[:64])
        nn.functional.cross_entropy(out.float(), y[:64]).backward()
        res[name] = {"exact": exact, "reasons": reasons,
                     "widths": {p: layer.num_neurons
                                for p, layer in perfora.dendritic_layers(model).items()},
                     "dendrites": ctl.num_dendrites,
                     "on_cuda": all(p.is_cuda for p in model.parameters()),
                     "bf16_autocast_dtype": str(out.dtype),
                     "bf16_grads_finite": all(torch.isfinite(p.grad).all().item()
                                              for p in model.parameters()
                                              if p.grad is not None)}

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29535"
    dist.init_process_group("nccl", rank=0, world_size=1)
    tmp = Path(os.environ.get("PERFORA_GPU_TMP", "/tmp"))
    try:
        for kind in ("ddp", "fsdp2"):
            x = _neuron_nets(dev)["mlp"][1]

            def fresh(kind: str = kind) -> nn.Module:
                torch.manual_seed(0)
                base = perfora.perforate(_neuron_nets(dev)["mlp"][0]).to(dev)
                if kind == "fsdp2":
                    return perfora.shard_fsdp2(base, mesh=init_device_mesh("cuda", (1,)))
                return perfora.wrap_ddp(base, device_ids=[0])

            y = torch.randint(0, 10, (x.shape[0],), device=dev)
            model, opt, ctl, exact, reasons = _neuron_steps(fresh(), x, y)
            _epoch(model, opt, x, y)  # the widened model trains on, over NCCL
            path = tmp / f"neurons_{kind}.safetensors"
            ctl.save(path)
            ctl2 = perfora.GrowthController(fresh(), growth="neurons", write_files=False)
            ctl2.set_optimizer(torch.optim.Adam, lr=1e-3)
            loaded = ctl2.load(path)
            with torch.no_grad():
                resumed = (loaded.model(x[:64]) - model(x[:64])).abs().max().item()
            res[kind] = {"exact": exact, "reasons": reasons,
                         "wrapper": type(model).__name__,
                         "sharded": any(type(p).__name__ == "DTensor"
                                        for p in model.parameters()),
                         "on_cuda": all(p.is_cuda for p in model.parameters()),
                         "widths": {p: layer.num_neurons for p, layer in
                                    perfora.dendritic_layers(model).items()},
                         "resumed_output_diff": resumed,
                         "optimizer_state_restored": bool(loaded.optimizer.state)}
    except Exception as exc:  # report, do not hide
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()

    width, batch = 2048, 4096
    torch.manual_seed(0)
    big = perfora.perforate(nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                          nn.Linear(width, width))).to(dev)
    ctl = perfora.GrowthController(big, growth="neurons", neuron_init="random",
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-4)
    opt, _ = ctl.build_optimizer()
    x = torch.randn(batch, width, device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        big(x).square().mean().backward()
        opt.step()

    step_s = _timed(step, repeats=10)
    torch.cuda.synchronize()
    start = time.perf_counter()
    decision = ctl.add_neurons()
    torch.cuda.synchronize()
    widen_s = time.perf_counter() - start
    res["widen_2048_pair"] = {"seconds": round(widen_s, 3),
                              "train_step_ms": round(step_s * 1e3, 3),
                              "width_after": decision.model[0].num_neurons}
    return res


def compiled_growth() -> dict:
    """``torch.compile`` (inductor, CUDA) through six restructures (three dendrite sets, three
    neuron steps) with the usual loop: the graphs each structure compiles, the compiled
    output against eager, and that none ran eagerly (dynamo's recompile limit untouched by
    the test; the controller raises it as it needs)."""
    from torch._inductor.compile_fx import compile_fx

    dev = torch.device("cuda", 0)
    torch._dynamo.reset()
    graphs: list = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return compile_fx(graph, example_inputs)

    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(64, 128), nn.ReLU(),
                                            nn.Linear(128, 128), nn.Tanh(),
                                            nn.Linear(128, 10))).to(dev)
    ctl = perfora.GrowthController(model, growth="neurons", neuron_init="random",
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    opt, _ = ctl.build_optimizer()
    run = torch.compile(model, backend=backend)
    x = torch.randn(256, 64, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)
    per_structure, diffs, step_ms = [], [], []
    changes = [ctl.add_dendrites, ctl.add_neurons] * 3
    for i in range(7):
        before = len(graphs)
        model.train()
        for _ in range(4):
            opt.zero_grad()
            nn.functional.cross_entropy(run(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        model.eval()
        with torch.no_grad():
            diffs.append((run(x) - model(x)).abs().max().item())
        per_structure.append(len(graphs) - before)
        model.train()
        for _ in range(3):  # warm: the step time of this structure's compiled graphs
            opt.zero_grad()
            nn.functional.cross_entropy(run(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            opt.zero_grad()
            nn.functional.cross_entropy(run(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        step_ms.append(round((time.perf_counter() - t0) / 20 * 1e3, 3))
        if i < len(changes):
            opt = changes[i]().optimizer
    res = {"graphs_per_structure": per_structure, "compiled_vs_eager_max_diff": diffs,
           "compiled_step_ms": step_ms, "dendrites": ctl.num_dendrites,
           "width": model[0].num_neurons,
           "recompile_limit": torch._dynamo.config.recompile_limit}
    torch._dynamo.reset()
    return res


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for gpu_check.json and the runs' files (default "
                         "benchmarks/results/local/gpu_check, git-ignored)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these checks")
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """The output folder: --out, else benchmarks/results/local/gpu_check. The stored
    results/gpu_check_h200.json is put together by hand from several runs (its note says
    which part comes from which), so there is no --update-stored."""
    return args.out or output_paths.LOCAL / "gpu_check"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.out = output_path(args)
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA device")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    checks = {"growth_on_cuda": growth_on_cuda, "nccl": nccl_restructures,
              "error_growth": error_growth, "neuron_growth": neuron_growth,
              "compiled_growth": compiled_growth,
              "lightning": lambda: lightning_runs(args.out),
              "deepspeed": lambda: deepspeed_runs(args.out),
              "deepspeed_zero3": lambda: deepspeed_zero3(args.out),
              "fsdp1": lambda: fsdp1_runs(args.out)}
    for name, fn in checks.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name:16s} {time.perf_counter() - start:6.1f}s  "
              f"{json.dumps(report[name], default=str)}", flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
