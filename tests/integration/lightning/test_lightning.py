"""The Lightning callback under real Trainers: ddp, ddp_spawn, ModelParallel (FSDP2) on CPU.

Distributed fits run ``tests/scripts/lightning/run_digits.py`` in a subprocess (Lightning's
ddp launcher re-executes the script for rank 1); every rank writes its final parameters
and the callback's decisions. Each subprocess has a timeout, so a hang fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import perfora
from perfora.errors import ConfigError, PerforaError
from perfora.integrations.lightning import (
    DendriteGrowth,
    prime_optimizer_state,
    saved_callback_state,
)
from tests.support.paths import ROOT, SCRIPTS
from tests.support.script_server import ScriptServer

sys.path.insert(0, str(SCRIPTS / "lightning"))
from run_digits import DigitsNet, digits_loaders  # noqa: E402

# the tests here share module-scoped runs: keep them on one pytest-xdist worker (a test
# that shares none gets a group of its own as well, so that xdist can balance the workers)
pytestmark = pytest.mark.xdist_group("test_lightning")

ROOT = ROOT
SCRIPT = SCRIPTS / "lightning" / "run_digits.py"
RUN_TIMEOUT = 240
# the FSDP2 fit several tests share (the first to ask runs it): a distributed checkpoint at
# every epoch's end, then test/validate/a fresh Trainer's test with some of them
FSDP2_RUN = ("--strategy", "model_parallel", "--max-epochs", "12", "--save-every-epoch", "--dcp",
             "--evaluate-checkpoints")


LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "WORLD_SIZE")


def run_fit(out: Path, *args: str, server: ScriptServer | None = None) -> None:
    """One ``trainer.fit`` of run_digits.py in a fresh process group; it must succeed.

    With ``server`` its ranks are forked from the warm script server as torchrun would start
    them (2 CPU ranks unless ``--devices 1``); without, ``python run_digits.py`` runs in a
    subprocess and Lightning's ddp launcher re-executes the script for rank 1.
    """
    if server is not None:
        ranks = 1 if "--devices" in args else 2
        run = server.run(SCRIPT, "--out", out, *args, cwd=out, ranks=ranks, unset=LAUNCH_ENV,
                         env={"PYTHONWARNINGS": "ignore"}, timeout=RUN_TIMEOUT)
        codes, log = run.codes, run.logs
    else:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        for name in LAUNCH_ENV:
            env.pop(name, None)
        proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args],
                              env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        codes, log = [proc.returncode], proc.stderr
    # every rank exits 0, after destroy_process_group() and a normal interpreter exit
    if not all(code == 0 for code in codes):
        raise AssertionError(f"fit failed ({codes}):\n{log[-3000:]}")


def record(out: Path, name: str = "rank0") -> dict:
    return torch.load(out / f"{name}.pt", weights_only=True)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, script_server):
    """Fits shared by several tests, each run once and only when a test asks for it: the
    DDP one as users start it (``python script.py``, Lightning's launcher), the others
    forked from the script server."""
    base = tmp_path_factory.mktemp("lightning")
    done: dict[str, Path] = {}

    def get(name: str, *args: str) -> Path:
        if name not in done:
            run_fit(base / name, *args,
                    server=None if name == "ddp_full" else script_server)
            done[name] = base / name
        return done[name]

    return get


# ---------------------------------------------------------------------- distributed fits
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_grows_keeps_ranks_identical_and_completion_stops_the_fit(runs):
    out = runs("ddp_full", "--strategy", "ddp", "--max-epochs", "12", "--save-every-epoch")
    r0, r1 = record(out, "rank0"), record(out, "rank1")
    assert r0["events"].count("restructure") == 2 and r0["num_dendrites"] == 2
    assert max_diff(r0["params"], r1["params"]) == 0.0
    # max_dendrites=2 reached at the third cycle's end (epoch 9): the fit stops early
    assert r0["completed"] and r0["should_stop"] and r0["events"][-1] == "complete"
    assert r0["epochs_run"] == 9 < 12
    assert r0["params"]["net.0.out_weight"].shape == (2, 16)
    metrics = (out / "logs" / "run" / "version_0" / "metrics.csv").read_text()
    assert "perfora/dendrites" in metrics and "perfora/params" in metrics
    assert "perfora/neuron_steps" in metrics
    assert (out / "perfora" / "metrics.csv").exists()


@pytest.mark.timeout(300)
def test_ddp_grows_neurons_with_ranks_identical(tmp_path, script_server):
    run_fit(tmp_path, "--strategy", "ddp", "--max-epochs", "7", "--growth", "neurons",
            server=script_server)
    r0, r1 = record(tmp_path, "rank0"), record(tmp_path, "rank1")
    assert r0["events"].count("restructure") == 2, r0["events"]
    assert r0["widths"] == r1["widths"] == {"net.0": 48, "net.2": 10}  # 16 + 16 + 16
    # what was grown reaches the loggers: 2 neuron steps, no dendrite set
    assert r0["logged"]["perfora/neuron_steps"] == 2.0 and r0["logged"]["perfora/dendrites"] == 0
    assert r0["params"]["net.2.base.weight"].shape == (10, 48)
    assert max_diff(r0["params"], r1["params"]) == 0.0


@pytest.mark.timeout(300)
def test_ddp_grows_neurons_through_group_and_instance_norms_with_ranks_identical(tmp_path,
                                                                                script_server):
    run_fit(tmp_path, "--strategy", "ddp", "--max-epochs", "7", "--growth", "neurons",
            "--net", "normed-cnn", server=script_server)
    r0, r1 = record(tmp_path, "rank0"), record(tmp_path, "rank1")
    assert r0["events"].count("restructure") == 2, r0["events"]
    assert r0["widths"] == r1["widths"] == {"net.1": 18, "net.4": 24, "net.8": 10}
    assert r0["params"]["net.2.weight"].shape == (18,)  # the GroupNorm: 3 groups of 2 -> 9
    assert r0["params"]["net.8.base.weight"].shape == (10, 24 * 64)  # through the flatten
    assert max_diff(r0["params"], r1["params"]) == 0.0


@pytest.mark.xdist_group("negative_control")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_negative_control_without_a_new_ddp_wrapper_the_ranks_diverge(tmp_path, script_server):
    run_fit(tmp_path, "--strategy", "ddp", "--max-epochs", "5", "--no-rewrap",
            server=script_server)
    r0, r1 = record(tmp_path, "rank0"), record(tmp_path, "rank1")
    assert r0["num_dendrites"] == 1
    assert max_diff(r0["params"], r1["params"]) > 1e-4


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_resume_after_a_restructure_ends_identical_to_an_uninterrupted_run(runs, tmp_path,
                                                                         script_server):
    full = record(runs("ddp_full", "--strategy", "ddp", "--max-epochs", "12", "--save-every-epoch"))
    assert full["events"][:3] == ["", "", "restructure"]
    # saved at the end of epoch 2, right after the first growth step
    ckpt = runs("ddp_full") / "ckpt" / "epoch2.ckpt"
    resumed_dir = tmp_path / "resumed"
    run_fit(resumed_dir, "--strategy", "ddp", "--max-epochs", "12", "--ckpt-path", str(ckpt),
            server=script_server)
    resumed = record(resumed_dir)
    assert resumed["events"] == full["events"]
    assert resumed["global_step"] == full["global_step"]
    assert max_diff(resumed["params"], full["params"]) == 0.0
    assert max_diff(resumed["params"], record(resumed_dir, "rank1")["params"]) == 0.0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fsdp2_through_model_parallel_strategy_matches_ddp(runs):
    ddp = record(runs("ddp_full", "--strategy", "ddp", "--max-epochs", "12", "--save-every-epoch"))
    out = runs("fsdp2", *FSDP2_RUN)
    fsdp = record(out)
    assert fsdp["sharded"], "the grown model must still be sharded"
    assert fsdp["events"] == ddp["events"] and fsdp["num_dendrites"] == 2
    assert max_diff(fsdp["params"], ddp["params"]) < 1e-6


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fsdp2_resume_from_a_distributed_checkpoint_ends_identical(runs, tmp_path, script_server):
    full = record(runs("fsdp2", *FSDP2_RUN))
    assert full["events"][:3] == ["", "", "restructure"]
    ckpt = runs("fsdp2") / "ckpt" / "epoch2.ckpt"  # saved right after the first growth step
    assert (ckpt / "meta.pt").exists()  # a folder of shards
    resumed_dir = tmp_path / "resumed"
    run_fit(resumed_dir, "--strategy", "model_parallel", "--max-epochs", "12",
            "--ckpt-path", str(ckpt), server=script_server)
    resumed = record(resumed_dir)
    assert resumed["sharded"] and resumed["events"] == full["events"]
    assert max_diff(resumed["params"], full["params"]) == 0.0


def assert_checkpoints_evaluated(out: Path) -> None:
    """What run_digits.py --evaluate-checkpoints recorded on each rank: every evaluated
    model holds the checkpoint's parameters exactly, still sharded, and scores what the fit
    logged at that epoch."""
    for rank in ("rank0", "rank1"):
        rec = record(out, rank)
        last = max(rec["epoch_params"])
        start, end = rec["epoch_params"][0], rec["epoch_params"][last]
        # the checkpoints really differ in structure from the model the fit ended with
        assert {k: v.shape for k, v in start.items()} != {k: v.shape for k, v in end.items()}
        for name, epoch in (("test_epoch0", 0), ("validate_last", last), ("fresh_epoch2", 2)):
            got, saved = rec["evaluated"][name], rec["epoch_params"][epoch]
            assert got["sharded"], name
            assert {k: v.shape for k, v in got["params"].items()} == \
                {k: v.shape for k, v in saved.items()}, name
            assert max_diff(got["params"], saved) == 0.0, name
            assert got["widths"]["net.0"] == saved["net.0.base.weight"].shape[0]
            kind = "val" if name.startswith("validate") else "test"
            assert got["metrics"][f"{kind}_loss"] == rec["epoch_metrics"][epoch]["val_loss"]
            assert got["metrics"][f"{kind}_acc"] == rec["epoch_metrics"][epoch]["val_acc"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp2_test_validate_and_a_fresh_trainer_load_checkpoints_of_other_structures(runs):
    # configure_model runs again at every stage: shard_fsdp2 refused the model it had sharded
    # (so no test after a fit), and a fresh module was not perforated before it
    assert_checkpoints_evaluated(runs("fsdp2", *FSDP2_RUN))


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("strategy", ["ddp", "model_parallel"])
def test_a_grown_two_device_checkpoint_resumes_on_one_device(runs, strategy, tmp_path,
                                                            script_server):
    # DDP's one-file checkpoint and ModelParallel's distributed (DCP) one, each saved on 2
    # devices right after the first growth step (the end of epoch 2)
    if strategy == "ddp":
        first = runs("ddp_full", "--strategy", "ddp", "--max-epochs", "12", "--save-every-epoch")
    else:
        first = runs("fsdp2", *FSDP2_RUN)
    saved = record(first)["epoch_params"][2]
    run_fit(tmp_path, "--strategy", strategy, "--devices", "1", "--max-epochs", "12",
            "--ckpt-path", str(first / "ckpt" / "epoch2.ckpt"), server=script_server)
    resumed = record(tmp_path)
    # the grown model came back whole: structure and every value as saved
    assert max_diff(resumed["start_params"], saved) == 0.0
    # and growth went on from there: the second step, then completion at the third cycle
    assert resumed["events"] == ["", "", "restructure", "", "", "restructure", "", "",
                                 "complete"]
    assert resumed["num_dendrites"] == 2 and resumed["completed"]
    assert resumed["sharded"] == (strategy == "model_parallel")


@pytest.mark.xdist_group("selective_bf16")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_selective_growth_with_bf16_mixed_and_accumulation_stays_in_sync(tmp_path, script_server):
    # one fit for three settings users combine: error-chosen partial sets, bf16-mixed
    # (a bf16 layer output meets float32 dendrite rows) and gradient accumulation
    run_fit(tmp_path, "--strategy", "ddp", "--max-epochs", "6", "--precision", "bf16-mixed",
            "--accumulate", "2", "--batch-size", "50", "--grow-fraction", "0.25",
            "--dendrite-init", "error", server=script_server)
    r0, r1 = record(tmp_path, "rank0"), record(tmp_path, "rank1")
    assert r0["num_dendrites"] == 2 and r0["events"][2] == r0["events"][5] == "restructure"
    assert r0["global_step"] == 6 * 7  # 14 micro-batches per epoch, one step per 2
    # the same neurons chosen on both ranks: a quarter of 16 per set
    assert r0["fed"] == r1["fed"] and [len(fed) for fed in r0["fed"]["net.0"]] == [4, 4]
    assert r0["params"]["net.0.bank_weight"].shape == (8, 64)
    assert max_diff(r0["params"], r1["params"]) == 0.0
    assert all(torch.isfinite(p).all() for p in r0["params"].values())


# ---------------------------------------------------------------------- in-process checks
def _trainer(tmp_path: Path, callback: DendriteGrowth, **kw) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=kw.pop("max_epochs", 4),
                      callbacks=[callback], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), **kw)


@pytest.mark.timeout(120)
def test_a_saved_checkpoint_loads_into_a_fresh_module_for_inference(tmp_path):
    torch.manual_seed(0)
    model = DigitsNet()
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", switch_mode="fixed",
                            fixed_switch_num=2, max_dendrites=1)
    trainer = _trainer(tmp_path, growth, max_epochs=3)
    train, val = digits_loaders(100)
    trainer.fit(model, train, val)
    assert growth.controller.num_dendrites == 1
    trainer.save_checkpoint(tmp_path / "grown.ckpt")
    # the callback's entry (read before a sharded strategy loads): structure and best model
    saved = saved_callback_state(tmp_path / "grown.ckpt", growth.state_key)
    assert {n: s["num_dendrites"] for n, s in saved["structure"].items()} == {"0": 1, "2": 1}
    assert saved["best"].keys() == growth.controller.best_snapshot[1].keys()
    fresh = DigitsNet()
    DendriteGrowth(module="net").prepare(fresh)  # perforated, no dendrites yet
    state = torch.load(tmp_path / "grown.ckpt")["state_dict"]  # weights_only by default
    fresh.load_state_dict(state)  # each layer takes the saved dendrite count
    x = torch.rand(5, 64)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


@pytest.mark.timeout(120)
def test_restore_best_after_a_fit_that_ended_before_completion(tmp_path):
    torch.manual_seed(0)
    model = DigitsNet()
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", switch_mode="fixed",
                            fixed_switch_num=2, max_dendrites=3)
    trainer = _trainer(tmp_path, growth, max_epochs=3)
    train, val = digits_loaders(100)
    trainer.fit(model, train, val)
    ctl = growth.controller
    assert not ctl.completed and ctl.num_dendrites == 1
    structure, best = ctl.best_snapshot
    with torch.no_grad():  # stands for epochs that made it worse
        for p in model.net.parameters():
            p.add_(0.5)
    restored = ctl.restore_best()
    assert restored is model.net and ctl.num_dendrites == structure["0"]["num_dendrites"]
    state = model.net.state_dict()
    assert state.keys() == best.keys()
    assert all(torch.equal(state[k], v) for k, v in best.items())


class _Moments(pl.Callback):
    """Adam's first moment of ``net.0.base.weight`` after each validation (cloned)."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        optimizer = trainer.optimizers[0]
        self.seen.append(optimizer.state[pl_module.net[0].base.weight]["exp_avg"].clone())


@pytest.mark.timeout(120)
def test_a_neuron_step_carries_the_moments_into_lightnings_new_optimizer(tmp_path):
    torch.manual_seed(0)
    model = DigitsNet()
    growth = DendriteGrowth(monitor="val_acc", mode="max", module="net", growth="neurons",
                            switch_mode="fixed", fixed_switch_num=2, max_neuron_steps=1)
    before, after = _Moments(), _Moments()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2,
                         callbacks=[before, growth, after], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    train, val = digits_loaders(100)
    trainer.fit(model, train, val)
    assert model.net[0].num_neurons == 32 and "added neuron step 1" in \
        growth.last_decision.reason
    old, new = before.seen[-1], after.seen[-1]  # around the neuron step
    assert old.shape == (16, 64) and new.shape == (32, 64)
    assert torch.equal(new[:16], old) and not new[16:].any()


@pytest.mark.timeout(120)
def test_a_missing_monitor_names_the_logged_metrics(tmp_path):
    growth = DendriteGrowth(monitor="val_accuracy", mode="max", module="net")
    train, val = digits_loaders(200)
    expected = r"did you mean 'val_acc'\?.*\['train_loss', 'val_acc', 'val_loss'\]"
    with pytest.raises(ConfigError, match=expected):
        _trainer(tmp_path, growth, max_epochs=1).fit(DigitsNet(), train, val)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ConfigError, match="mode must be 'min' or 'max'"):
        DendriteGrowth(mode="maximum")
    with pytest.raises(ConfigError, match="max_dendrites"):
        DendriteGrowth(max_dendrites=-1)
    with pytest.raises(ConfigError, match="monitor must be the name of a logged metric"):
        DendriteGrowth(monitor="")
    with pytest.raises(ConfigError, match="n_epochs_to_switch"):
        DendriteGrowth(patience=0)
    with pytest.raises(ConfigError, match=r"no such submodule; its children are \['net'\]"):
        DendriteGrowth(module="backbone").prepare(DigitsNet())


@pytest.mark.timeout(60)
def test_unsupported_strategies_are_refused_with_the_alternative(tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    growth = DendriteGrowth(module="net")
    with pytest.raises(PerforaError, match=r"use_orig_params=True.*wrap_fsdp1"):
        growth._check_strategy(FSDPStrategy(use_orig_params=False))
    with pytest.raises(PerforaError, match=r"wrap_fsdp1"):
        DendriteGrowth()._check_strategy(FSDPStrategy())  # no module= to wrap
    growth._check_strategy(FSDPStrategy())  # Lightning's default use_orig_params=True
    with pytest.raises(ConfigError, match=r"ModelParallelStrategy give DendriteGrowth\(module"):
        DendriteGrowth()._check_strategy(ModelParallelStrategy())
    spawn = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    with pytest.raises(PerforaError, match=r"growth.prepare\(model\)"):
        growth.setup(spawn, DigitsNet(), "fit")
    model = DigitsNet()
    growth.prepare(model)  # perforated in the launching process: accepted
    growth.setup(spawn, model, "fit")
    assert perfora.dendritic_layers(model.net)


@pytest.mark.timeout(60)
def test_a_spawned_fit_that_would_grow_a_fused_layer_is_refused_before_it_trains():
    # the weights come back through load_state_dict, which cannot order a fused layer's rows
    from tests.support.widening import FusedGatedMLP

    class FusedNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), FusedGatedMLP(8, 16),
                                           torch.nn.Linear(8, 3))

    model = FusedNet()
    spawn = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    growth = DendriteGrowth(module="net")  # growth='auto': neurons too
    growth.prepare(model)
    with pytest.raises(PerforaError, match=r"1.gate_up_proj would gain neurons.*"
                                           r"strategy='ddp'.*growth='dendrites'"):
        growth.setup(spawn, model, "fit")
    DendriteGrowth(module="net", growth="dendrites").setup(spawn, model, "fit")  # accepted
    ddp = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    DendriteGrowth(module="net").setup(ddp, model, "fit")  # ranks started apart: accepted


def test_primed_adam_takes_the_same_first_step_as_a_fresh_one():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(a.detach().clone())
    fresh, primed = torch.optim.Adam([a], lr=0.1), torch.optim.Adam([b], lr=0.1)
    prime_optimizer_state(primed)
    assert primed.state and b.grad is None and torch.equal(a, b)
    for p, opt in ((a, fresh), (b, primed)):
        p.grad = torch.full_like(p, 0.5)
        opt.step()
    assert torch.equal(a, b)


@pytest.mark.xdist_group("example")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_example_grows_dendrites_that_beat_the_baseline(tmp_path, script_server):
    run = script_server.run(ROOT / "examples" / "lightning_digits.py", "--patience", "3",
                            "--max-epochs", "40", "--out", tmp_path, cwd=tmp_path,
                            unset=LAUNCH_ENV, env={"PYTHONWARNINGS": "ignore"},
                            timeout=RUN_TIMEOUT)
    assert run.ok, run.logs[-3000:]
    found = re.search(r"dendrites=(\d+), best val_acc=([\d.]+)", run.log())
    assert found, run.log()
    kept = int(found.group(1))
    rows = (tmp_path / "perfora_runs" / "best_arch_scores.csv").read_text().splitlines()[1:]
    best = [float(row.split(",")[2]) for row in rows]  # best val_acc per dendrite count
    # the returned model holds dendrites and is the best architecture tried, beating the
    # network it grew from
    assert kept >= 1 and best[kept] == max(best) > best[0]


@pytest.mark.xdist_group("ddp_spawn")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_example_under_ddp_spawn_reports_what_the_spawned_run_trained(tmp_path,
                                                                          script_server):
    # a short schedule (one dendrite set, kept): what is checked is the report, and the
    # spawned ranks' start costs more than their epochs
    run = script_server.run(ROOT / "examples" / "lightning_digits.py", "--strategy",
                            "ddp_spawn", "--patience", "2", "--max-epochs", "20",
                            "--max-dendrites", "1", "--out", tmp_path, cwd=tmp_path,
                            unset=LAUNCH_ENV,
                            env={"PYTHONWARNINGS": "ignore"}, timeout=RUN_TIMEOUT)
    assert run.ok, run.logs[-3000:]
    line = next(x for x in run.log().splitlines() if x.startswith("stopped after"))
    found = re.match(r"stopped after (\d+) epochs: dendrites=(\d+), best val_acc=([\d.]+), "
                     r"parameters=(\d+), run files in (.+) \(trained in the spawned "
                     r"processes", line)
    assert found, line  # numbers, not "see the launching process" and nan
    epochs, kept, best = int(found.group(1)), int(found.group(2)), float(found.group(3))
    run_dir = tmp_path / "perfora_runs"
    assert found.group(5) == str(run_dir)
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert epochs == len(rows) - 1 > 0  # one row per epoch the spawned rank 0 reported
    arch = [row.split(",") for row in (run_dir / "best_arch_scores.csv").read_text()
            .splitlines()[1:]]
    assert best == pytest.approx(max(float(r[2]) for r in arch), abs=5e-5) and best > 0.5
    # the grown model came back to the launching process: the best architecture's size, and
    # its trained values (the ranks' scores average two halves of the validation set, the
    # launching process scores it whole: they differ by at most a sample or two)
    assert kept >= 1 and int(found.group(4)) == int(arch[kept][1])
    returned = re.search(r"^the returned model: val_acc=([\d.]+)$", run.log(), flags=re.M)
    assert returned, run.log()
    assert float(returned.group(1)) == pytest.approx(best, abs=0.01)


@pytest.mark.timeout(300)
def test_fsdp2_through_model_parallel_strategy_grows_neurons_as_ddp_does(tmp_path, script_server):
    # the widening under ModelParallelStrategy: one layer pair at a time on the shards, the
    # model sharded again, Lightning's new optimizer given the moments. Each step follows a
    # rewind to the best model (the script's retain is off), which re-shards: the moments
    # must be kept before it (they were lost, and the run ended 0.2 away from DDP's). DDP's
    # run is the reference.
    for strategy in ("ddp", "model_parallel"):
        evaluate = ("--save-every-epoch", "--dcp", "--evaluate-checkpoints") \
            if strategy == "model_parallel" else ()
        run_fit(tmp_path / strategy, "--strategy", strategy, "--max-epochs", "7", "--growth",
                "neurons", *evaluate, server=script_server)
    ddp, fsdp = record(tmp_path / "ddp"), record(tmp_path / "model_parallel")
    assert fsdp["sharded"], "the widened model must still be sharded"
    assert fsdp["events"] == ddp["events"] and fsdp["events"].count("restructure") == 2
    assert fsdp["widths"] == ddp["widths"] == {"net.0": 48, "net.2": 10}
    assert max_diff(fsdp["params"], ddp["params"]) < 1e-6
    assert max_diff(fsdp["params"], record(tmp_path / "model_parallel", "rank1")["params"]) == 0
    # and test/validate/a fresh Trainer load checkpoints of other widths, re-sharded
    assert_checkpoints_evaluated(tmp_path / "model_parallel")
