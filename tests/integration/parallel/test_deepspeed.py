"""Growth under DeepSpeed ZeRO-3 (and ZeRO-2, ZeRO-0) through ``perfora.wrap_deepspeed``: 2 real
CPU ranks (gloo, ``DS_ACCELERATOR=cpu``), every scenario in one launch (DeepSpeed's start-up
costs seconds per process). The join has a deadline, so a hang fails the test.
"""

from __future__ import annotations

import os
import weakref
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import perfora
from perfora.checkpoint.format import load_checkpoint
from perfora.distributed.collectives import rank_zero_decides
from tests.support.ranks import run_world
from tests.support.widening import FusedGatedMLP

pytest.importorskip("deepspeed")

WORLD = 2
STAGES = (3, 2, 0)
STEPS = 2
LR = 0.1


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)))


def data(epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: rank r trains on rows r::WORLD (equal halves)."""
    g = torch.Generator().manual_seed(100 * epoch + step)
    return torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)


def probe() -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(99))


def settings() -> dict:
    return {"n_epochs_to_switch": 2, "max_dendrites": 2, "dendrite_init": "default",
            "write_files": False, "growth": "dendrites"}


# the score sequence: best at epoch 2 (no dendrites yet), growth at the plateau, best again
# after the first set, growth again, then completion rewinds to the best (one set)
SCORES = [0.5, 0.6, 0.6, 0.6, 0.7, 0.8, 0.8, 0.8, 0.75, 0.75, 0.75, 0.75, 0.75, 0.75]


def run_plain() -> dict:
    """The unsharded run of the same seeds and data: the reference."""
    model = make_model()
    ctl = perfora.GrowthController(model, **settings())
    ctl.set_optimizer(torch.optim.SGD, lr=LR)
    opt, _ = ctl.build_optimizer()
    events = []
    for epoch, score in enumerate(SCORES):
        for step in range(STEPS):
            x, y = data(epoch, step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        decision = ctl.step(score)
        events.append(decision.action)
        if decision.restructured or decision.complete:
            opt = decision.optimizer
        if decision.complete:
            break
    return {"events": events, "state": {k: v.clone() for k, v in model.state_dict().items()}}


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().reshape(-1).float() for _, v in sorted(state.items())])


def _rank_diff(state: dict[str, torch.Tensor]) -> float:
    flat = _flat(state)
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def _no_shm_op() -> None:
    """DeepSpeed's CPU accelerator builds a C++ shared-memory op at start-up; gloo is enough."""
    import importlib

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def wrap(model: nn.Module, stage: int, adam: bool = False, **extra: dict) -> nn.Module:
    """``wrap_deepspeed`` with ZeRO ``stage`` and plain SGD (or Adam with a StepLR schedule,
    stepped by the engine at every step)."""
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9, **extra}
    if not adam:
        return perfora.wrap_deepspeed(model, config, optimizer=torch.optim.SGD,
                                      optimizer_args={"lr": LR})
    return perfora.wrap_deepspeed(model, config, optimizer=torch.optim.Adam,
                                  optimizer_args={"lr": 0.01},
                                  lr_scheduler=torch.optim.lr_scheduler.StepLR,
                                  lr_scheduler_args={"step_size": 1, "gamma": 0.8})


def engine_moments(engine: nn.Module, stage: int) -> dict[str, dict[str, torch.Tensor]]:
    """Adam's moments and step per parameter, whole, read with DeepSpeed's own API (ZeRO) or
    from the torch optimizer (ZeRO-0)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    out = {}
    for name, p in sorted(engine.module.named_parameters()):
        if stage == 0:
            state = engine.optimizer.state.get(p, {})
            out[name] = {k: v.clone() for k, v in state.items()}
        else:
            out[name] = {k: safe_get_full_optimizer_state(p, k).clone()
                         for k in ("exp_avg", "exp_avg_sq")}
    if stage > 0:  # one step count per flat partition
        inner = engine.optimizer.optimizer
        out["step"] = {"step": torch.tensor([float(s["step"]) for s in inner.state.values()])}
    return out


def moments_carried(before: dict, after: dict, only: str = "") -> dict:
    """Old slices kept (and not all zero), new slices zero, step counts kept (of the
    parameters whose name holds ``only``)."""
    kept, zero_new, nonzero = True, True, False
    for name, entry in before.items():
        if only not in name and name != "step":
            continue
        for key, old in entry.items():
            new = after[name][key]
            if name == "step" or key == "step":
                kept &= bool(torch.equal(new, old))
                continue
            if "bank" in name:  # dendrite banks are not widened here
                continue
            lead = tuple(slice(0, n) for n in old.shape)
            kept &= bool(torch.equal(new[lead], old))
            rest = new.clone()
            rest[lead] = 0
            zero_new &= bool(rest.abs().sum() == 0)
            nonzero |= bool(old.abs().sum() > 0)
    return {"kept": kept, "zero_new": zero_new, "nonzero": nonzero}


def _record_gathers() -> list[int]:
    """Record how many values each ZeRO-3 gather by perfora brings together."""
    from perfora.parallel import zero3

    sizes: list[int] = []
    gathered = zero3._gathered

    def recording(params: list) -> object:
        sizes.append(sum(int(p.ds_numel) for p in params))
        return gathered(params)

    recording.__wrapped__ = gathered  # type: ignore[attr-defined]
    zero3._gathered = recording
    return sizes


def _stop_recording_gathers() -> None:
    from perfora.parallel import zero3

    zero3._gathered = getattr(zero3._gathered, "__wrapped__", zero3._gathered)


def run_deepspeed(rank: int, stage: int, tmp: Path) -> dict:
    """The same run under ZeRO ``stage``: growth checked at every restructure."""
    gathers = _record_gathers()
    engine = wrap(make_model(), stage)
    ctl = perfora.GrowthController(engine, **settings())
    hooks = [_hooks(engine)]
    # the first engine's (partitions of the) parameters, flattened: stage 0 has no flat buffer
    flat = weakref.ref(_flat_buffer(engine) if stage else torch.empty(0))
    freed = None
    out_change, engines, best, best_full, retired_refused = [], [engine], None, None, None
    events = []
    for epoch, score in enumerate(SCORES):
        engine.train()
        for step in range(STEPS):
            x, y = data(epoch, step)
            loss = nn.functional.cross_entropy(engine(x[rank::WORLD]), y[rank::WORLD])
            engine.backward(loss)
            engine.step()
        engine.eval()
        with torch.no_grad():
            before = engine(probe())
        previous_best = ctl._best  # replaced whenever a new best is snapshotted
        decision = ctl.step(score, model=engine)
        events.append(decision.action)
        if decision.action == "restructure":
            if retired_refused is None:  # the replaced engine may not be reported again
                try:
                    ctl.step(score, model=engine)
                    retired_refused = False
                except perfora.OrderError:
                    retired_refused = True
            engine = decision.model
            engines.append(engine)
            hooks.append(_hooks(engine))
            freed = flat() is None if freed is None else freed
            with torch.no_grad():
                out_change.append((engine(probe()) - before).abs().max().item())
        if ctl._best is not previous_best and decision.action == "continue":
            best = ctl.best_snapshot  # a collective under ZeRO-3: every rank
            best_full = {k: v.clone() for k, v in ctl.backend.full_state(engine).items()}
        if decision.complete:
            engine = decision.model
            break
    final = ctl.backend.full_state(engine)
    assert best is not None and best_full is not None
    best_diff = max((final[k] - best_full[k]).abs().max().item() for k in best_full) \
        if set(final) == set(best_full) else float("inf")
    snapshot_diff = max((best[1][k] - best_full[k]).abs().max().item() for k in best_full)
    optimizer_is_engines = ctl.optimizer is engine.optimizer
    dendrites = ctl.num_dendrites
    files = _checkpoint(ctl, engine, stage, tmp / f"zero{stage}.safetensors")
    plain = run_plain()
    plain_diff = max((final[k] - plain["state"][k]).abs().max().item()
                     for k in plain["state"]) if set(final) == set(plain["state"]) else None
    return {"events": events, "plain_events": plain["events"], "out_change": out_change,
            "rank_diff": _rank_diff(final), "plain_diff": plain_diff, "best_diff": best_diff,
            "snapshot_diff": snapshot_diff, **files,
            "dendrites": dendrites, "engines_distinct": len({id(e) for e in engines}),
            "partitioned": all(hasattr(p, "ds_id") for p in engine.module.parameters()),
            "file_keys": sorted(load_checkpoint(files["path"]).tensors["model"])
            == sorted(final),
            "largest_gather": max(gathers, default=0),
            "hooks": hooks, "old_buffers_freed": freed, "retired_refused": retired_refused,
            "optimizer_is_engines": optimizer_is_engines}


def _checkpoint(ctl: perfora.GrowthController, engine: nn.Module, stage: int, path: Path
                ) -> dict:
    """Save; load into a plain model, and with ``controller.load`` (under ZeRO-3 into a plain
    copy, then partitioned again); under ZeRO-3 ``from_checkpoint`` onto an engine is
    refused, naming ``controller.load``."""
    ctl.save(path)
    dist.barrier()
    engine.eval()
    with torch.no_grad():
        out = engine(probe())
    reloaded = make_model()
    perfora.load_model(reloaded, path)
    sizes = {"largest_layer": max(sum(p.numel() for p in layer.parameters())
                                  for layer in perfora.dendritic_layers(reloaded).values()),
             "model_size": sum(p.numel() for p in reloaded.parameters())}
    with torch.no_grad():
        reloaded_diff = (reloaded(probe()) - out).abs().max().item()
    loaded = ctl.load(path).model
    loaded.eval()
    with torch.no_grad():
        loaded_diff = (loaded(probe()) - out).abs().max().item()
    # a structure of two sets matched (its weights to be loaded elsewhere): the engine is
    # rebuilt over it, the same on every rank
    specs = {path: {**spec, "num_dendrites": 2} for path, spec in
             load_checkpoint(path).meta["structure"].items()}
    matched = ctl.match_structure(specs)
    matched_sets = [layer.num_dendrites for layer in perfora.dendritic_layers(matched).values()]
    matched_diff = _rank_diff(ctl.backend.full_state(matched))
    sizes["largest_layer"] = max(sizes["largest_layer"], *(  # the matched layers are larger
        sum(int(getattr(p, "ds_numel", p.numel())) for p in layer.parameters())
        for layer in perfora.dendritic_layers(matched).values()))
    sizes["model_size"] = ctl.parameter_count()
    return {"path": str(path), "reloaded_diff": reloaded_diff, "loaded_diff": loaded_diff,
            "matched_diff": matched_diff, "matched_sets": matched_sets,
            **sizes}


def _flat_buffer(engine: nn.Module) -> torch.Tensor:
    """The engine's flat buffer of (this rank's partitions of) the parameters."""
    optimizer = engine.optimizer
    groups = getattr(optimizer, "fp16_partitioned_groups_flat", None) or \
        getattr(optimizer, "bit16_groups_flat", None)
    return groups[0]


def _hooks(engine: nn.Module) -> int:
    """Hooks on the model's modules: the retired engines' must all be gone."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks)
               for m in engine.module.modules())


def run_bf16(rank: int) -> dict:
    """ZeRO-3 with bf16 weights: grown layers keep the engine's dtype, outputs unchanged."""
    engine = wrap(make_model(), 3, bf16={"enabled": True})
    ctl = perfora.GrowthController(engine, **settings())
    changes = []
    for epoch in range(2):
        x, y = data(epoch, 0)
        loss = nn.functional.cross_entropy(engine(x[rank::WORLD].bfloat16()).float(),
                                           y[rank::WORLD])
        engine.backward(loss)
        engine.step()
        with torch.no_grad():
            before = engine(probe().bfloat16())
            engine = ctl.add_dendrites().model
            changes.append((engine(probe().bfloat16()) - before).abs().max().item())
    return {"out_change": changes, "rank_diff": _rank_diff(ctl.backend.full_state(engine)),
            "dtypes": sorted({str(p.ds_tensor.dtype) for p in engine.module.parameters()})}


def _train_steps(engine: nn.Module, rank: int, epoch: int) -> None:
    """STEPS optimizer steps, each on this rank's half of the epoch's batch."""
    for step in range(STEPS):
        x, y = data(epoch, step)
        engine.backward(nn.functional.cross_entropy(engine(x[rank::WORLD]), y[rank::WORLD]))
        engine.step()


def _train_then_probe(engine: nn.Module, rank: int, epoch: int) -> torch.Tensor:
    """One epoch of training, then the outputs on the probe in eval mode: what a growth step
    that follows must leave unchanged."""
    engine.train()
    _train_steps(engine, rank, epoch)
    engine.eval()
    with torch.no_grad():
        return engine(probe())


def run_neurons(rank: int, stage: int, init: str = "gradmax") -> dict:
    """growth='neurons' under ZeRO ``stage``: the widening keeps the output, a new engine
    takes the widened module, the ranks stay identical, the new rows come from the recorded
    error (``init``, on rank-specific data); ZeRO-3 gathers one layer pair at a time."""
    torch.manual_seed(0)
    engine = wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8),
                                                  nn.Tanh(), nn.Linear(8, 3))), stage,
                  adam=True)
    ctl = perfora.GrowthController(engine, **{**settings(), "growth": "neurons",
                                              "max_neuron_steps": 2, "neuron_init": init,
                                              "switch_mode": "every_epoch"})
    sizes = _record_gathers() if stage == 3 else []
    exact, widths, carried, reasons, modes = [], [], [], [], []
    for epoch in range(3):
        before = _train_then_probe(engine, rank, epoch)
        moments = engine_moments(engine, stage)
        schedule = (engine.lr_scheduler.last_epoch, engine.optimizer.param_groups[0]["lr"])
        decision = ctl.step(0.5 + 0.1 * epoch, model=engine)
        engine = decision.model
        reasons.append(decision.reason)
        modes.append(engine.training)  # a new engine keeps eval mode
        with torch.no_grad():
            exact.append(bool(torch.equal(engine(probe()), before)))
        if decision.restructured:
            carried.append({**moments_carried(moments, engine_moments(engine, stage)),
                            "schedule_kept": schedule == (engine.lr_scheduler.last_epoch,
                                                          engine.optimizer.param_groups[0]["lr"])
                            and schedule[0] > 0})
        widths.append({p: layer.num_neurons
                       for p, layer in perfora.dendritic_layers(engine).items()})
    _stop_recording_gathers()
    # the widened run saved and loaded into a fresh engine of the narrow model: the widths,
    # the weights and Adam's moments come back
    path = Path(os.environ["PERFORA_TEST_TMP"]) / f"neurons_zero{stage}_{init}.safetensors"
    x, y = data(9, 0)  # one step on the returned model, so that its optimizer has moments
    engine.train()
    engine.backward(nn.functional.cross_entropy(engine(x[rank::WORLD]), y[rank::WORLD]))
    engine.step()
    state = ctl.backend.full_state(engine)
    ctl.save(path)
    moments = engine_moments(engine, stage)
    torch.manual_seed(0)
    fresh = wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8),
                                                 nn.Tanh(), nn.Linear(8, 3))), stage, adam=True)
    ctl2 = perfora.GrowthController(fresh, **{**settings(), "growth": "neurons"})
    fresh = ctl2.load(path).model
    again = ctl2.backend.full_state(fresh)
    reloaded = {k: v for k, v in moments_carried(moments, engine_moments(fresh, stage)).items()
                if k != "zero_new"} == {"kept": True, "nonzero": True} \
        and set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state)
    return {"exact": exact, "widths": widths, "rank_diff": _rank_diff(state), "carried": carried,
            "reasons": reasons, "modes": modes, "state": {k: v.tolist() for k, v in state.items()},
            "is_engine": type(engine).__name__, "reloaded": reloaded,
            "largest_gather": max(sizes, default=0),
            "model_size": sum(v.numel() for v in state.values()),
            "shapes": {k: list(v.shape) for k, v in state.items()}}


def run_fused_zero3(rank: int) -> dict:
    """Two neuron steps of a fused gate-and-up MLP under ZeRO-3 (one layer pair gathered at a
    time): the output is unchanged, the ranks identical, and a saved run loads into a fresh
    engine of the narrow model with the same outputs (the rows' order replayed)."""
    def build() -> nn.Module:
        torch.manual_seed(0)
        return wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), FusedGatedMLP(8, 8),
                                                    nn.Linear(8, 3))), 3, adam=True)

    engine = build()
    ctl = perfora.GrowthController(engine, **{**settings(), "growth": "neurons",
                                              "max_neuron_steps": 2,
                                              "switch_mode": "every_epoch"})
    exact, rows = [], []
    for epoch in range(2):
        before = _train_then_probe(engine, rank, epoch)
        engine = ctl.step(0.5 + 0.1 * epoch, model=engine).model
        with torch.no_grad():
            exact.append(bool(torch.equal(engine(probe()), before)))
        rows.append(ctl.backend.full_state(engine)["1.gate_up_proj.base.weight"].shape[0])
    state = ctl.backend.full_state(engine)
    path = Path(os.environ["PERFORA_TEST_TMP"]) / "fused_zero3.safetensors"
    ctl.save(path)
    fresh = perfora.GrowthController(build(), **{**settings(), "growth": "neurons"}
                                     ).load(path).model
    with torch.no_grad():
        fresh.eval()
        reloaded = bool(torch.equal(fresh(probe()), engine(probe())))
    return {"exact": exact, "rows": rows, "rank_diff": _rank_diff(state), "reloaded": reloaded}


def run_auto_undo(rank: int) -> dict:
    """growth='auto' under ZeRO-2: a second dendrite set fails, is undone (a rewind), and a
    neuron step follows; the moments of the widened layers carry on through both."""
    torch.manual_seed(0)
    engine = wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))),
                  2, adam=True)
    ctl = perfora.GrowthController(engine, **{**settings(), "growth": "auto",
                                              "switch_mode": "every_epoch"})
    reasons, carried = [], None
    for epoch, score in enumerate((0.5, 0.6, 0.55)):
        _train_steps(engine, rank, epoch)
        moments = engine_moments(engine, 2)
        decision = ctl.step(score, model=engine)
        engine = decision.model
        reasons.append(decision.reason)
        if epoch == 2:
            carried = moments_carried(moments, engine_moments(engine, 2), only=".base.")
    return {"reasons": reasons, "carried": carried,
            "rank_diff": _rank_diff(ctl.backend.full_state(engine))}


# growth at epochs 3 and 7, a retry at 9, completion at 11 (each after a rewind to the best)
RESUME_SCORES = SCORES
SAVE_AT = 6  # after the first growth, two epochs of Adam, and a best snapshot one epoch old


def _schedule(engine: nn.Module) -> list:
    return [engine.lr_scheduler.last_epoch, engine.optimizer.param_groups[0]["lr"]]


def _train_epochs(engine: nn.Module, ctl: perfora.GrowthController, rank: int,
                  epochs: range, path: Path | None = None) -> tuple[nn.Module, list, list]:
    saved: list = []
    events: list = []
    for epoch in epochs:
        _train_steps(engine, rank, epoch)
        decision = ctl.step(RESUME_SCORES[epoch], model=engine)
        engine = decision.model
        events.append(decision.action)
        if epoch == SAVE_AT and path is not None:
            ctl.save(path)  # on every rank: the moments are read collectively
            saved = _schedule(engine)
            dist.barrier()  # rank 0 wrote this epoch's run-file checkpoint too
            events.append(any(k.endswith("exp_avg") for k in _file_tensor_keys(
                ctl.run_dir / "latest.safetensors")))
        if decision.complete:
            break
    return engine, saved, events


def run_resume(rank: int, stage: int, tmp: Path) -> dict:
    """Adam with a StepLR schedule under ZeRO ``stage``, saved after a growth and two
    epochs, then resumed in a new controller and engine: it must end where the
    uninterrupted run ends, through two more growth steps and rewinds to the loaded best
    snapshot. The uninterrupted run also writes run files (whose checkpoints read the
    moments on every rank: a hang here fails the test)."""
    path = tmp / f"resume_zero{stage}.safetensors"
    torch.manual_seed(0)
    engine = wrap(make_model(), stage, adam=True)
    ctl = perfora.GrowthController(engine, **{**settings(), "write_files": True,
                                              "checkpoint_time_budget": None},
                                   run_dir=tmp / f"run_zero{stage}")
    engine, saved, events = _train_epochs(engine, ctl, rank, range(len(RESUME_SCORES)), path)
    whole = ctl.backend.full_state(engine)
    dist.barrier()
    resumed = wrap(make_model(), stage, adam=True)
    ctl2 = perfora.GrowthController(resumed, **settings())
    # a checkpoint of another model is refused before anything changes (under ZeRO-3 the
    # load is rehearsed on the structure-only template)
    other = perfora.perforate(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
    bad = tmp / f"other_zero{stage}_rank{rank}.safetensors"
    perfora.GrowthController(other, **settings()).save(bad)
    with torch.no_grad():
        before = resumed(probe())
    try:
        ctl2.load(bad)
        bad_refused = False
    except perfora.CheckpointError:
        with torch.no_grad():
            bad_refused = bool(torch.equal(ctl2.model(probe()), before))
    resumed = ctl2.load(path).model
    # perfora.resume onto a fresh engine gives the same model (the structure comes with the
    # load: under ZeRO-3 on an unsharded copy, partitioned again)
    direct = perfora.resume(wrap(make_model(), stage, adam=True), path,
                            run_dir=tmp / f"direct_zero{stage}")
    loaded_state = ctl2.backend.full_state(resumed)
    direct_state = direct.backend.full_state(direct.model)
    resume_same = set(direct_state) == set(loaded_state) and all(
        torch.equal(direct_state[k], loaded_state[k]) for k in loaded_state)
    moments = engine_moments(resumed, stage)
    schedule = _schedule(resumed)
    resumed, _, after = _train_epochs(resumed, ctl2, rank,
                                      range(SAVE_AT + 1, len(RESUME_SCORES)))
    again = ctl2.backend.full_state(resumed)
    latest_has_moments = events.pop(SAVE_AT + 1)  # the marker _train_epochs put there
    # the engine's state (saved by parameter name) loads into a plain Adam run too, each
    # moment onto its own parameter; a plain run's (saved by index) into an engine warns
    plain = perfora.GrowthController(make_model(), **settings())
    plain.set_optimizer(torch.optim.Adam, lr=0.01)
    plain.build_optimizer()
    plain.load(path)
    params = dict(plain.model.named_parameters())
    by_name = all(torch.equal(plain.optimizer.state[params[name]][key], value)
                  for name, entry in moments.items() if name != "step"
                  for key, value in entry.items())
    plain_path = tmp / f"plain_zero{stage}_rank{rank}.safetensors"
    plain.save(plain_path)
    with pytest.warns(UserWarning, match="saved by index"):
        perfora.GrowthController(wrap(make_model(), stage, adam=True),
                                 **settings()).load(plain_path)
    try:  # Adam's moments do not load into an SGD engine
        perfora.GrowthController(wrap(make_model(), stage), **settings()).load(path)
        refused = ""
    except perfora.CheckpointError as exc:
        refused = str(exc)
    return {"diff": max((again[k] - whole[k]).abs().max().item() for k in whole)
            if set(again) == set(whole) else None,
            "dendrites": [ctl.num_dendrites, ctl2.num_dendrites], "events": events,
            "resumed_events": after,
            "moments_loaded": all(v.abs().sum() > 0 for name, entry in moments.items()
                                  if name != "step" for v in entry.values()),
            "schedule": schedule, "saved_schedule": saved, "refused": refused,
            "rank_diff": _rank_diff(again),
            "latest_has_moments": latest_has_moments, "bad_refused": bad_refused,
            "plain_by_name": by_name, "resume_same": resume_same}


def _file_tensor_keys(path: Path) -> list[str]:
    ckpt = load_checkpoint(path)
    return [f"{group}/{key}" for group, tensors in ckpt.tensors.items() for key in tensors]


BF16_SETUPS = {  # DeepSpeed's bf16 wrappers: (stage, config)
    "BF16_Optimizer": (1, {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}),
    "FP16_UnfusedOptimizer": (0, {"bf16": {"enabled": True}}),
}


def run_bf16_wrapper(rank: int, tmp: Path, wrapper: str) -> dict:
    """bf16 through one of DeepSpeed's wrappers (``BF16_SETUPS``): a neuron step carries
    Adam's moments, and a checkpoint holds them."""
    stage, extra = BF16_SETUPS[wrapper]
    torch.manual_seed(0)
    engine = wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))),
                  stage, adam=True, **extra)
    kind = type(engine.optimizer).__name__
    ctl = perfora.GrowthController(engine, **{**settings(), "growth": "neurons",
                                              "max_neuron_steps": 1, "switch_mode": "every_epoch"})

    def train(engine: nn.Module, epoch: int) -> None:
        x, y = data(epoch, 0)
        engine.backward(nn.functional.cross_entropy(engine(x[rank::WORLD].bfloat16()).float(),
                                                    y[rank::WORLD]))
        engine.step()

    read = partial(wrapper_moments, wrapper=wrapper)
    train(engine, 0)
    moments = read(engine)
    engine = ctl.step(0.5, model=engine).model
    carried = moments_carried(moments, read(engine))
    train(engine, 1)
    path = tmp / f"{wrapper}.safetensors"
    ctl.save(path)
    moments = read(engine)
    fresh = wrap(perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))),
                 stage, adam=True, **extra)
    fresh = perfora.GrowthController(fresh, **settings()).load(path).model
    loaded = read(fresh)
    return {"kind": kind, "carried": carried,
            "reloaded": all(torch.equal(loaded[n][k], v) for n, e in moments.items()
                            for k, v in e.items())}


def wrapper_moments(engine: nn.Module, wrapper: str) -> dict[str, dict[str, torch.Tensor]]:
    """Adam's moments per parameter, whole: through DeepSpeed's API (BF16_Optimizer), or
    from each parameter's fp32 master copy (the unfused wrapper)."""
    if wrapper == "BF16_Optimizer":
        return engine_moments(engine, 1)
    optimizer = engine.optimizer
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return {names[id(low)]: {k: v.clone() for k, v in optimizer.optimizer.state[high].items()}
            for lows, highs in zip(optimizer.fp16_groups, optimizer.fp32_groups, strict=True)
            for low, high in zip(lows, highs, strict=True)}


def run_time_budget(rank: int, tmp: Path) -> dict:
    """Run files under ZeRO-2 with the default time budget: each plain epoch's write is
    decided by rank 0's clock for every rank, since every rank reads the moments for it
    (ranks deciding apart would hang here)."""
    engine = wrap(make_model(), 2, adam=True)
    ctl = perfora.GrowthController(engine, **{**settings(), "write_files": True},
                                   run_dir=tmp / "time_budget")
    for epoch in range(8):
        x, y = data(epoch, 0)
        engine.backward(nn.functional.cross_entropy(engine(x[rank::WORLD]), y[rank::WORLD]))
        engine.step()
        engine = ctl.step(0.1 * epoch, model=engine).model
    ctl.finish()
    dist.barrier()
    latest = load_checkpoint(tmp / "time_budget" / "latest.safetensors")
    return {"epoch": latest.meta["controller"]["epoch"],
            "moments": any(k.endswith("exp_avg") for k in latest.tensors.get("optimizer", {}))}


def scenarios(rank: int, world: int, tmp: str) -> dict:
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK=str(rank), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), PERFORA_TEST_TMP=tmp)
    _no_shm_op()
    return {**{f"zero{stage}": run_deepspeed(rank, stage, Path(tmp)) for stage in STAGES},
            "bf16": run_bf16(rank), "neurons": run_neurons(rank, 2),
            "neurons_zero3": run_neurons(rank, 3), "neurons_zero0": run_neurons(rank, 0, "random"),
            "fused_zero3": run_fused_zero3(rank),
            "auto_undo": run_auto_undo(rank),
            **{f"resume_zero{stage}": run_resume(rank, stage, Path(tmp)) for stage in (3, 2, 0)},
            "time_budget": run_time_budget(rank, Path(tmp)),
            **{f"bf16_{w}": run_bf16_wrapper(rank, Path(tmp), w) for w in BF16_SETUPS},
            "rank_zero_decides": [rank_zero_decides(flag) for flag in
                                  (rank == 0, rank == 1, True, False)]}


@pytest.mark.timeout(120)
def test_zero3_zero2_zero0_growth_rewind_checkpoint(tmp_path: Path) -> None:
    """Outputs unchanged by growth, ranks identical after two restructures, the plain run's
    parameters, the rewind restores the best weights, the file loads into a plain model."""
    results = run_world(scenarios, tmp_path / "job", WORLD, str(tmp_path), join_s=110)
    for stage in [f"zero{s}" for s in STAGES]:
        r0 = results[0][stage]
        assert r0["events"] == r0["plain_events"]
        assert r0["events"].count("restructure") == 2 and r0["events"][-1] == "complete"
        assert max(r0["out_change"]) < 1e-6
        for r in results:
            assert r[stage]["rank_diff"] == 0.0
            assert r[stage]["plain_diff"] is not None and r[stage]["plain_diff"] < 1e-5
            assert r[stage]["best_diff"] < 1e-6 and r[stage]["snapshot_diff"] < 1e-6
            assert r[stage]["reloaded_diff"] < 1e-6 and r[stage]["loaded_diff"] < 1e-6
            assert r[stage]["matched_diff"] == 0.0 and r[stage]["matched_sets"] == [2, 2], stage
            assert r[stage]["file_keys"]
        assert r0["dendrites"] == 1
        assert r0["engines_distinct"] == 3
        assert r0["retired_refused"] and r0["optimizer_is_engines"]
        # the retired engine's buffers are freed at once (the old engine object is still
        # referenced here), not at the next garbage collection
        assert r0["old_buffers_freed"]
        # each new engine registers its hooks once: the retired ones' are gone
        assert r0["hooks"][1] == r0["hooks"][2] <= r0["hooks"][0]
    for r in results:
        assert r["bf16"]["out_change"] == [0.0, 0.0] and r["bf16"]["rank_diff"] == 0.0
        assert r["bf16"]["dtypes"] == ["torch.bfloat16"]
    z3 = results[0]["zero3"]
    assert z3["partitioned"]
    # growth, the rewind and the checkpoint file gathered one layer at a time, never the model
    assert 0 < z3["largest_gather"] <= z3["largest_layer"] < z3["model_size"]

    for kind in ("neurons", "neurons_zero3", "neurons_zero0"):
        neurons = [r[kind] for r in results]
        assert all(r["modes"] == [False] * 3 for r in neurons)  # eval mode kept by new engines
        # Adam's moments carried into the new engine: old slices kept, new ones zero
        for r in neurons:
            assert r["carried"] == [{"kept": True, "zero_new": True, "nonzero": True,
                                     "schedule_kept": True}] * 2, kind
        assert neurons[0]["widths"] == [{"0": 16, "2": 16, "4": 3}, {"0": 24, "2": 24, "4": 3},
                                        {"0": 24, "2": 24, "4": 3}], kind
        assert all(neurons[0]["exact"][:2]) and neurons[0]["is_engine"] == "DeepSpeedEngine"
        assert {r["rank_diff"] for r in neurons} == {0.0}
        assert all(r["reloaded"] for r in neurons), kind
    for r in results:  # a fused gate-and-up layer: 8 neurons a step, a gate and an up row each
        fused = r["fused_zero3"]
        assert fused == {"exact": [True, True], "rows": [32, 48], "rank_diff": 0.0,
                         "reloaded": True}, fused
    for r in results:  # the undo's rewind comes before the neuron step: moments still carried
        auto = r["auto_undo"]
        assert auto["reasons"][2].startswith("dendrite set 2 did not beat the best score: "
                                             "undone; added neuron step 1 instead"), auto
        assert auto["carried"] == {"kept": True, "zero_new": True, "nonzero": True}
        assert auto["rank_diff"] == 0.0
    for stage in (3, 2, 0):  # Adam's moments and the LR schedule resume where they were saved
        for r in results:
            resume = r[f"resume_zero{stage}"]
            assert resume["diff"] == 0.0, (stage, resume)
            assert resume["dendrites"] == [1, 1] and resume["moments_loaded"], (stage, resume)
            assert resume["events"][SAVE_AT + 1:] == resume["resumed_events"], resume
            assert resume["resumed_events"].count("restructure") >= 1, resume
            assert resume["resumed_events"][-1] == "complete", resume
            assert resume["schedule"] == resume["saved_schedule"], (stage, resume)
            assert resume["schedule"][0] > 0, (stage, resume)
            if stage > 0:
                assert "exp_avg" in resume["refused"], resume
            assert resume["rank_diff"] == 0.0 and resume["latest_has_moments"], (stage, resume)
            assert resume["bad_refused"] and resume["plain_by_name"], (stage, resume)
            assert resume["resume_same"], (stage, resume)
    for r in results:  # DeepSpeed's bf16 wrappers too
        for wrapper in BF16_SETUPS:
            assert r[f"bf16_{wrapper}"] == {"kind": wrapper, "reloaded": True, "carried": {
                "kept": True, "zero_new": True, "nonzero": True}}, r[f"bf16_{wrapper}"]
    # the run writer's time budget: rank 0's clock decides for every rank
    assert [r["rank_zero_decides"] for r in results] == [[True, False, True, False]] * 2
    # finish() writes latest, with the moments read on every rank
    assert [r["time_budget"] for r in results] == [{"epoch": 8, "moments": True}] * 2
    zero2, zero3 = results[0]["neurons"], results[0]["neurons_zero3"]
    assert zero3["shapes"] == zero2["shapes"]  # the same widening, partitioned
    # ZeRO-3 widened one layer pair at a time, never the whole model
    assert 0 < zero3["largest_gather"] < zero3["model_size"]
    # GradMax rows from the error recorded on each rank's own data, reduced over ranks: the
    # same rows under ZeRO-2 and ZeRO-3 (only the partitioning differs)
    for run in (zero2, zero3):
        assert run["reasons"][:2] == ["plateau: added neuron step 1 (0: +8 gradmax, 2: +8 "
                                      "gradmax)", "plateau: added neuron step 2 (0: +8 "
                                      "gradmax, 2: +8 gradmax)"], run["reasons"]
    assert all(torch.allclose(torch.tensor(zero2["state"][k]), torch.tensor(zero3["state"][k]),
                              atol=1e-5) for k in zero2["state"])
