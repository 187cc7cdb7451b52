"""`perfora convert` on a corpus of realistic training scripts (tests/scripts/convert_corpus/).

Every regular script is converted in both modes; the diff is checked for the PerforatedAI
recipe's ordering (perforate, then the resume load, then the optimizer, then the
DataParallel/DDP wrap; in compat mode the zero-filled gradients strictly between zero_grad()
and backward()),
idempotence, kept comments and arguments; the converted scripts then really run on CPU and
must grow dendrites, read back from the run files they write: each in its own process(es)
forked from a warm script server (the DDP ones as 2 gloo ranks with torchrun's environment),
a few with plain `python script.py`, and one DDP script under `perfora launch` (which starts
torch.distributed.run). Irregular scripts keep their irregular part and get line-numbered
instructions.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("libcst", reason="perfora convert needs libcst (the dev extra has it)")

from perfora import convert_source  # noqa: E402
from perfora.cli import main  # noqa: E402
from tests.support.paths import ROOT, SCRIPTS
from tests.support.script_server import ScriptServer

# the tests here share module-scoped runs: keep them on one pytest-xdist worker
pytestmark = pytest.mark.xdist_group("test_convert_script")

CORPUS = SCRIPTS / "convert_corpus"
ROOT = ROOT
IRREGULAR = sorted(p.stem for p in CORPUS.glob("irregular_*.py"))
REGULAR = sorted(p.stem for p in CORPUS.glob("*.py") if p.stem not in IRREGULAR)
DDP = {"ddp_torchrun", "ddp_main_fn"}
WRAPPED = DDP | {"dataparallel"}
MODES = ("native", "compat")
# a short growth schedule so a few epochs add a dendrite set: restructure after epoch 2,
# training complete after epoch 4 (max_dendrites=1)
GROW = {"switch_mode": "fixed", "fixed_switch_num": "2", "max_dendrites": "1",
        "retain_all_dendrites": "True"}
# native mode: dendrites only, as the runs below check (compat mode always grows dendrites)
NATIVE_GROW = {**GROW, "growth": "dendrites"}
EPOCHS = 6
RUN_TIMEOUT = 150
# how each script takes its number of epochs (as its author wrote it)
EPOCH_ARGS = {"nested_closures": [str(EPOCHS)]}
EPOCH_ENV = {"single_noargparse_sgd", "while_epochs", "ddp_main_fn"}


def source(name: str) -> str:
    return (CORPUS / f"{name}.py").read_text()


@functools.cache
def converted(name: str, mode: str):
    return convert_source(source(name), mode, name=name,
                          settings=dict(NATIVE_GROW if mode == "native" else GROW))


def line_no(text: str, pattern: str, start: int = 0) -> int:
    """1-based number of the first line at or after ``start`` matching ``pattern``."""
    for i, line in enumerate(text.splitlines()[start:], start + 1):
        if re.search(pattern, line):
            return i
    raise AssertionError(f"no line matches {pattern!r}")


def added_lines(diff: str) -> list[str]:
    return [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("++")]


def comments(text: str) -> list[str]:
    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    return [t.string for t in toks if t.type == tokenize.COMMENT]


# --------------------------------------------------------------------------- the corpus
def test_corpus_is_diverse_enough():
    assert len(REGULAR) >= 10 and len(IRREGULAR) >= 3
    texts = {n: source(n) for n in REGULAR}
    assert any("argparse" not in t for t in texts.values())
    assert sum("argparse" in t for t in texts.values()) >= 5
    assert any("lr_scheduler" not in t for t in texts.values())
    assert any("ReduceLROnPlateau" in t for t in texts.values())
    assert any("StepLR" in t for t in texts.values())
    assert any("enumerate(" in t for t in texts.values())
    assert any("DataParallel(model)" in t for t in texts.values())
    assert sum("DistributedDataParallel" in t or "DDP(" in t for t in texts.values()) >= 2


# ------------------------------------------------------------------- conversion and diff
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REGULAR)
def test_regular_script_converts_cleanly_and_idempotently(name, mode):
    result = converted(name, mode)
    assert result.changed and not result.manual, [f.format(name) for f in result.manual]
    compile(result.output, f"{name}.py", "exec")
    again = convert_source(result.output, mode, settings=dict(GROW))
    assert not again.changed and again.already_converted and again.diff() == ""
    # converting in the other mode does not stack a second conversion on top
    other = convert_source(result.output, "compat" if mode == "native" else "native")
    assert not other.changed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REGULAR)
def test_seed_ordering_in_the_diff(name, mode):
    """perforate < resume load < optimizer < wrap; all of them added lines of the diff."""
    result = converted(name, mode)
    out, added = result.output, added_lines(result.diff(f"{name}.py"))
    if mode == "native":
        patterns = [r"= perfora\.perforate\(", r"\.load\(\w+\.perfora_resume\)",
                    r"\.build_optimizer\(\)"]
    else:
        patterns = [r"= UPA\.perforate_model\(", r"UPA\.load_system\(",
                    r"GPA\.pai_tracker\.setup_optimizer\("]
    lines = [line_no(out, p) for p in patterns]
    assert lines == sorted(lines) and len(set(lines)) == 3, (patterns, lines)
    for p in patterns:
        assert any(re.search(p, ln) for ln in added), p
    if name in WRAPPED:
        wrap = line_no(out, r"= (nn\.|torch\.nn\.)?(parallel\.)?"
                            r"(DataParallel|DistributedDataParallel|DDP)\(")
        assert lines[-1] < wrap
    # the score is reported after the batches are trained, once per epoch
    report = line_no(out, r"\.step\(\w+(, model=\w+)?\)\s+# perfora" if mode == "native"
                     else r"add_validation_score\(")
    assert line_no(out, r"\.backward\(\)") < report
    # the user's own optimizer construction is gone (the controller/tracker builds it)
    assert not re.search(r"^\s*\w+ = (torch\.)?optim\.\w+\(\w+\.parameters\(\)", out, re.M)
    assert not re.search(r"^\s*\w+, \w+ = build_optimizer\(", out, re.M)


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_compat_gradient_preinit_strictly_between_zero_grad_and_backward(name):
    out = converted(name, "compat").output.splitlines()
    pre = [i for i, ln in enumerate(out) if "param.grad = torch.zeros_like(param)" in ln]
    assert len(pre) == 1
    zero = max(i for i, ln in enumerate(out[:pre[0]]) if ".zero_grad(" in ln)
    back = pre[0] + next(i for i, ln in enumerate(out[pre[0]:]) if ".backward(" in ln)
    assert zero < pre[0] < back
    assert not any(".backward(" in ln for ln in out[zero:pre[0]])
    # ... and the initialization run exits after the first backward(), before step()
    exit_at = next(i for i, ln in enumerate(out) if "exit(0)" in ln)
    step = back + next(i for i, ln in enumerate(out[back:]) if "optimizer.step()" in ln)
    assert back < exit_at < step


@pytest.mark.parametrize("name", REGULAR)
def test_native_mode_needs_no_seed_workarounds(name):
    out = converted(name, "native").output
    assert "find_unused_parameters=True" not in out
    assert "zeros_like" not in out and "perforate_model_parallel" not in out


def test_ddp_arguments_kept_and_find_unused_parameters_added_in_compat_only():
    native = converted("ddp_torchrun", "native").output
    assert "model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)" in native
    assert "controller.step(val_acc, model=model)" in native
    assert "model = decision.model" in native
    compat = converted("ddp_torchrun", "compat").output
    assert ("model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1, "
            "find_unused_parameters=True)") in compat
    # an explicit find_unused_parameters=False becomes True; the other arguments stay
    compat = converted("ddp_main_fn", "compat").output
    assert "find_unused_parameters=True,\n" in compat and "find_unused_parameters=False" \
        not in compat
    assert "gradient_as_bucket_view=True," in compat
    assert "GPA.pai_tracker.initialize_tracker_settings()" in compat
    native = converted("ddp_main_fn", "native").output
    assert "find_unused_parameters=False," in native  # the user's DDP, untouched
    assert "controller.step(val_loss, model=ddp_model)" in native


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REGULAR + IRREGULAR)
def test_comments_and_untouched_lines_are_kept(name, mode):
    result = converted(name, mode)
    kept = comments(result.output)
    for comment in comments(result.source):
        assert comment in kept, comment
    # every line the diff removes belongs to the optimizer, scheduler or wrap statements
    removed = [ln[1:] for ln in result.diff().splitlines()
               if ln.startswith("-") and not ln.startswith("--")]
    assert len(removed) <= 8, removed
    for line in removed:
        assert re.search(r"optim|sched|Adam|SGD|RMSprop|Adagrad|DDP|DataParallel|"
                         r"find_unused|gradient_as_bucket|^\s*model,$|^\s*\)$|nesterov",
                         line), line


# Exact types and arguments, as the PerforatedAI recipe insists:
# (mode, script) -> lines that must appear.
SAME_ARGS = {
    ("native", "single_argparse_steplr"): [
        "controller.set_optimizer(torch.optim.Adam, lr=args.lr, weight_decay=1e-4)",
        "controller.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=10, gamma=0.5)"],
    ("compat", "single_argparse_steplr"): [
        "GPA.pai_tracker.set_optimizer(torch.optim.Adam)",
        "GPA.pai_tracker.set_scheduler(torch.optim.lr_scheduler.StepLR)",
        "optimArgs = {'params': model.parameters(), 'lr': args.lr, 'weight_decay': 1e-4}",
        "schedArgs = {'step_size': 10, 'gamma': 0.5}"],
    ("native", "single_noargparse_sgd"): [  # positional lr mapped to its name
        "controller.set_optimizer(torch.optim.SGD, lr=0.05, momentum=0.9)"],
    ("native", "helper_optimizer"): [  # the helper's parameters replaced by the call's
        "controller.set_optimizer(AdamW, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))",
        "controller.set_scheduler(CosineAnnealingLR, T_max=args.epochs)"],
    ("compat", "plateau_enumerate"): [
        "GPA.pai_tracker.set_scheduler(optim.lr_scheduler.ReduceLROnPlateau)",
        "schedArgs = {'mode': 'min', 'factor': 0.5, 'patience': 3}",
        "maximizing_score=False"],
    ("native", "cnn_multistep"): [
        "controller.set_optimizer(torch.optim.SGD, lr=0.05, momentum=args.momentum,",
        "controller.set_scheduler(torch.optim.lr_scheduler.MultiStepLR, milestones=[8, 12], "
        "gamma=0.2)"],
}


@pytest.mark.parametrize("mode,name", sorted(SAME_ARGS))
def test_optimizer_and_scheduler_keep_their_types_and_arguments(mode, name):
    out = converted(name, mode).output
    for line in SAME_ARGS[mode, name]:
        assert line in out, line


def test_scheduler_steps_are_removed_and_plateau_score_is_minimized():
    out = converted("plateau_enumerate", "native").output
    assert "sched.step(val_loss)" not in out
    assert "PerforaConfig(maximize=False" in out
    assert "decision = controller.step(val_loss)" in out
    out = converted("nested_closures", "native").output
    assert "scheduler.step()" not in out and "maximize=False" in out  # val_mse: minimized


def test_script_without_argparse_gets_a_tolerant_parser():
    out = converted("single_noargparse_sgd", "compat").output
    assert "import argparse" in out
    assert "args, _ = parser.parse_known_args()" in out  # other arguments stay the script's
    assert "--perforate_model_parallel" not in out  # only for DataParallel/DDP


# ------------------------------------------------------------------------ irregular
def test_irregular_two_optimizers_left_as_they_are_with_line_numbers():
    name = "irregular_two_optimizers"
    src = source(name)
    for mode in MODES:
        result = converted(name, mode)
        for text in ("opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)",
                     "opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)",
                     "opt_d.step()", "opt_g.step()"):
            assert text in result.output
        g, d = line_no(src, r"^opt_g ="), line_no(src, r"^opt_d =")
        several = [f for f in result.manual if "several optimizers" in f.message]
        assert several and several[0].line == g and f"lines {g}, {d}" in several[0].message
        loop = line_no(src, r"^for epoch in")
        assert any(f.line == loop and "by hand" in f.message for f in result.manual)


def test_irregular_conditional_optimizer_left_as_is_with_line_numbers():
    name = "irregular_conditional_optimizer"
    src = source(name)
    for mode in MODES:
        result = converted(name, mode)
        start = line_no(src, r"^if args\.optim")
        block = "\n".join(src.splitlines()[start - 1:start + 3])
        assert block in result.output
        first = line_no(src, r"torch\.optim\.SGD")
        found = [f for f in result.manual if "conditionally" in f.message]
        assert found and found[0].line == first and f"(line {start};" in found[0].message
        assert "set_optimizer(" not in result.output.replace("set_optimizer(cls", "")


def test_irregular_no_epoch_loop_is_reported_and_the_loop_untouched():
    name = "irregular_no_epoch_loop"
    src = source(name)
    loop_start = line_no(src, r"^for it in range")
    loop = "\n".join(src.splitlines()[loop_start - 1:])
    for mode in MODES:
        result = converted(name, mode)
        assert loop in result.output
        assert ".step(loss" not in result.output and "add_validation_score" not in result.output
        found = [f for f in result.manual if f.line == loop_start]
        assert found and "no epoch loop" in found[0].message


def test_no_optimizer_at_all_changes_nothing():
    result = convert_source("import torch\nprint(torch.ones(2))\n")
    assert not result.changed and result.manual and result.manual[0].line == 1


# ------------------------------------------------------------------------------- CLI
def test_cli_prints_a_diff_and_check_exit_codes(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(source("single_argparse_steplr"))
    assert main(["convert", str(script)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"--- a/{str(script).lstrip('/')}\n+++ b/")
    assert "+    model = perfora.perforate(model)" in out
    assert f"{script}:" in err and ": note: " in err
    assert script.read_text() == source("single_argparse_steplr")  # nothing written
    assert main(["convert", "--check", str(script)]) == 1
    assert "needs conversion" in capsys.readouterr().err
    assert main(["convert", "--check", "--mode", "compat", str(script)]) == 1


def test_cli_write_keeps_a_backup_and_is_idempotent(tmp_path, capsys):
    script = tmp_path / "train.py"
    original = source("dataparallel")
    script.write_text(original)
    assert main(["convert", "--write", "--mode", "compat", str(script)]) == 0
    assert (tmp_path / "train.py.bak").read_text() == original
    converted_text = script.read_text()
    assert "GPA.pai_tracker.add_validation_score(val_acc, model)" in converted_text
    assert "original kept in" in capsys.readouterr().err
    assert main(["convert", "--check", "--mode", "compat", str(script)]) == 0
    assert main(["convert", "--write", "--mode", "compat", str(script)]) == 0
    assert script.read_text() == converted_text
    assert not (tmp_path / "train.py.bak.1").exists()
    assert "nothing to change" in capsys.readouterr().err


def test_cli_reports_manual_parts_and_errors(tmp_path, capsys):
    script = tmp_path / "gan.py"
    script.write_text(source("irregular_two_optimizers"))
    assert main(["convert", str(script)]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(script))}:9: manual: several optimizers", err)
    assert "part(s) to do by hand" in err
    # --check: the converter's part is pending (1); after --write only manual work is left,
    # which the converter cannot see any more, so the script counts as converted (0)
    assert main(["convert", "--check", str(script)]) == 1
    assert main(["convert", "--write", str(script)]) == 0
    assert main(["convert", "--check", str(script)]) == 0
    capsys.readouterr()
    untouchable = tmp_path / "groups.py"  # nothing convertible: manual work only
    untouchable.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n"
                           "opt = torch.optim.SGD([{'params': model.weight}], lr=0.1)\n")
    assert main(["convert", "--check", str(untouchable)]) == 1
    assert "needs changes by hand" in capsys.readouterr().err
    assert main(["convert", "--set", "max_dendrits=2", str(script)]) == 2
    assert "did you mean 'max_dendrites'" in capsys.readouterr().err
    assert main(["convert", "--set", "oops", str(script)]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    assert main(["convert", str(bad)]) == 2
    assert "not valid Python" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.py")]) == 2
    assert main(["convert", "--check", "--write", str(script)]) == 2


def test_score_and_direction_options(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(source("plateau_enumerate"))
    assert main(["convert", "--score", "val_acc", "--maximize", str(script)]) == 0
    out = capsys.readouterr().out
    assert "+    decision = controller.step(val_acc)" in out
    assert "PerforaConfig(maximize=True)" in out


@pytest.mark.timeout(60)
def test_missing_libcst_exits_2_with_install_hint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(source("single_argparse_steplr"))
    code = ("import sys; sys.modules['libcst'] = None\n"
            "from perfora.cli import main\n"
            f"sys.exit(main(['convert', {str(script)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert 'pip install "perfora[convert]"' in proc.stderr


# ------------------------------------------------------------------ running the scripts
def _command(name: str, path: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """``python script.py`` as a user runs it (single-process scripts only)."""
    assert name not in DDP
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    args = list(EPOCH_ARGS.get(name, [] if name in EPOCH_ENV else ["--epochs", str(EPOCHS)]))
    if name in EPOCH_ENV:
        env["EPOCHS"] = str(EPOCHS)
    return [sys.executable, str(path)] + args + extra, env


def run_converted(name: str, mode: str, workdir: Path,
                  extra: list[str] | None = None) -> subprocess.CompletedProcess:
    """Write the converted script into ``workdir`` and run it there (stdin closed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.py"
    path.write_text(converted(name, mode).output)
    cmd, env = _command(name, path, extra or [])
    return subprocess.run(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)


def metrics(workdir: Path, name: str, mode: str) -> list[dict[str, str]]:
    folder = workdir / ("perfora_runs" / Path(name) if mode == "native" else Path("PAI"))
    with open(folder / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


RESUMED = {"test_compat_resumes_from_the_newest_switch": ("single_argparse_steplr", "compat"),
           "test_native_resumes_from_a_checkpoint": ("helper_optimizer", "native")}


@dataclass
class Run:
    """One converted script's run: each rank's exit code, its folder, rank 0's output."""

    codes: list[int]
    workdir: Path

    @property
    def log(self) -> str:
        return "\n".join((self.workdir / f"rank{r}.log").read_text(errors="replace")
                         for r in range(len(self.codes)))


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, script_server):
    """Run every converted script the session selected, half of them on the shared script
    server and half on a second one started here (2 cores): each rank a process forked
    from a warm interpreter (2 with torchrun's environment for the DDP scripts) that runs
    the script as __main__."""
    wanted = {(item.callspec.params["name"], item.callspec.params["mode"])
              for item in request.session.items
              if item.originalname == "test_converted_script_runs_and_grows"}
    wanted |= {RESUMED[item.originalname] for item in request.session.items
               if item.originalname in RESUMED}
    base = tmp_path_factory.mktemp("converted_runs")
    done: dict[tuple[str, str], Run] = {}
    with ScriptServer(["torch", "torch._dynamo", "torch.distributed", "perfora",
                       "perfora.compat", "matplotlib.pyplot"]) as second:
        servers = (script_server, second)
        queued: list[list[tuple[str, str]]] = [[], []]
        for i, (name, mode) in enumerate(sorted(wanted, key=lambda k: (k[0] not in DDP, k))):
            workdir = base / f"{mode}_{name}"
            workdir.mkdir()
            path = workdir / f"{name}.py"
            path.write_text(converted(name, mode).output)
            argv = EPOCH_ARGS.get(name, [] if name in EPOCH_ENV else ["--epochs", str(EPOCHS)])
            servers[i % 2].submit(path, *argv, cwd=workdir, ranks=2 if name in DDP else 1,
                                  env={"EPOCHS": str(EPOCHS)} if name in EPOCH_ENV else {},
                                  timeout=RUN_TIMEOUT)
            queued[i % 2].append((name, mode))
        for server, keys in zip(servers, queued):
            for key in keys:
                done[key] = Run(server.result().codes, base / f"{key[1]}_{key[0]}")
    return done


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REGULAR)
def test_converted_script_runs_and_grows(name, mode, runs):
    run = runs[name, mode]
    assert run.codes == [0] * (2 if name in DDP else 1), run.log[-6000:]
    workdir = run.workdir
    rows = metrics(workdir, name, mode)
    events = [r["event"] for r in rows]
    assert "restructure" in events and events[-1] == "complete", events
    assert max(int(r["dendrites"]) for r in rows) >= 1
    assert int(rows[-1]["dendrites"]) == 1  # retain_all_dendrites: the grown set is kept
    assert int(rows[-1]["params"]) > int(rows[0]["params"])
    folder = workdir / ("perfora_runs" / Path(name) if mode == "native" else Path("PAI"))
    assert (folder / ("switch_1.safetensors" if mode == "native" else "switch_1.pt")).is_file()
    assert len(rows) < EPOCHS  # it stopped on training complete, before the last epoch
    if mode == "compat":
        assert (folder / ".training_complete").is_file()
    assert "Traceback" not in run.log
    if name in DDP:  # two real ranks: the scripts print on rank 0 only
        rank0, rank1 = ((workdir / f"rank{r}.log").read_text() for r in (0, 1))
        assert "epoch" in rank0 and "epoch" not in rank1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compat_resumes_from_the_newest_switch(tmp_path, runs):
    """The multi-GPU recipe's restart: again with --pai_load_folder, from the newest switch_N."""
    name = "single_argparse_steplr"
    first = runs[name, "compat"]
    assert first.codes == [0], first.log[-3000:]
    workdir = first.workdir
    shutil.copytree(workdir / "PAI", tmp_path / "PAI")
    assert (tmp_path / "PAI" / "switch_1.pt").is_file()
    second = run_converted(name, "compat", tmp_path, extra=["--pai_load_folder", "PAI"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Loaded PAI state from PAI/switch_1.pt" in second.stdout
    rows = metrics(tmp_path, name, "compat")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]  # epochs 1-2 from switch_1
    assert rows[-1]["event"] == "complete" and int(rows[-1]["dendrites"]) == 1
    assert second.stdout.count("epoch ") == 2  # it trained epochs 3 and 4 only
    assert (tmp_path / "PAI" / ".training_complete").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_native_resumes_from_a_checkpoint(tmp_path, runs):
    """--perfora_resume switch_1: weights, dendrites, controller and optimizer state."""
    name = "helper_optimizer"
    first = runs[name, "native"]
    assert first.codes == [0], first.log[-3000:]
    workdir = first.workdir
    shutil.copytree(workdir / "perfora_runs", tmp_path / "perfora_runs")
    second = run_converted(name, "native", tmp_path, extra=["--perfora_resume", "switch_1"])
    assert second.returncode == 0, second.stderr[-3000:]
    rows = metrics(tmp_path, name, "native")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["event"] == "complete" and int(rows[-1]["dendrites"]) == 1
    assert len(second.stdout.splitlines()) == 2  # resumed after epoch 2: epochs 3 and 4
    # numbered as in the uninterrupted run (the loop started again at 0, and a sampler's
    # set_epoch then reshuffled as in epochs 0 and 1)
    assert [line.split()[0] for line in second.stdout.splitlines()] == ["2", "3"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compat_dataparallel_initialization_run(tmp_path):
    """The PerforatedAI recipe's first DataParallel run: one batch, save the settings, exit."""
    proc = run_converted("dataparallel", "compat", tmp_path,
                         extra=["--perforate_model_parallel"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Initialization complete" in proc.stdout
    assert (tmp_path / "PAI" / "pai_tracker_settings.json").is_file()
    assert not list((tmp_path / "PAI").glob("switch_*.pt"))


def test_readme_diff_is_what_the_tool_prints():
    page = (ROOT / "docs" / "convert.md").read_text()  # the diff the docs show
    shown = page.split("```diff\n", 1)[1].split("```", 1)[0]
    path = "tests/scripts/convert_corpus/ddp_torchrun.py"
    assert shown == convert_source(source("ddp_torchrun"), "native",
                                   name="ddp_torchrun").diff(path)


def test_irregular_per_batch_scheduler_and_missing_score():
    name = "irregular_no_score"
    src = source(name)
    opt = line_no(src, r"optimizer = torch\.optim\.SGD")
    sched_step = line_no(src, r"^\s+scheduler\.step\(\)")
    loop = line_no(src, r"for epoch in range")
    for mode in MODES:
        result = converted(name, mode)
        for text in ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
                     "scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2,",
                     "        scheduler.step()\n",
                     "        test(model, [(x[192:], y[192:])])\n\n\nif __name__"):
            assert text in result.output, text
        per_batch = [f for f in result.manual if f.line == sched_step]
        assert per_batch and f"(line {opt})" in per_batch[0].message
        assert any(f.line == loop and "no validation score" in f.message
                   for f in result.manual)
        assert "set_optimizer" not in result.output and "setup_optimizer" not in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compat_ddp_script_runs_under_perfora_launch(tmp_path):
    """`perfora launch` passes --pai_load_folder; the converted script trains to complete."""
    path = tmp_path / "ddp_torchrun.py"
    path.write_text(converted("ddp_torchrun", "compat").output)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "perfora.cli", "launch", "--nproc-per-node",
                           "2", "--attempt-timeout", "200", str(path), "--epochs", str(EPOCHS)],
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT + 60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--pai_load_folder PAI" in proc.stdout + proc.stderr
    assert "Starting from beginning (no switch_x.pt files found in PAI)" in proc.stdout
    assert (tmp_path / "PAI" / ".training_complete").is_file()
    rows = metrics(tmp_path, "ddp_torchrun", "compat")
    assert rows[-1]["event"] == "complete" and int(rows[-1]["dendrites"]) == 1


def test_script_written_for_perforatedai_only_gets_its_imports_switched():
    """A PerforatedAI-style script (tests/scripts/compat) with PerforatedAI's own imports."""
    ours = (SCRIPTS / "compat" / "pai_single.py").read_text()
    theirs = ours.replace("from perfora.compat import", "from perforatedai import")
    assert theirs != ours
    result = convert_source(theirs, "compat")
    assert result.output == ours and len(result.findings) == 2
    assert not convert_source(result.output, "compat").changed
    native = convert_source(theirs, "native")
    assert not native.changed and "--mode compat" in native.findings[0].message
    assert native.manual  # the script cannot run without perforatedai: --check exits 1


def test_check_on_a_perforatedai_script_in_native_mode_exits_1(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "compat" / "pai_single.py").read_text().replace(
        "from perfora.compat import", "from perforatedai import"))
    assert main(["convert", "--check", str(script)]) == 1
    assert "needs changes by hand" in capsys.readouterr().err


@pytest.mark.parametrize("mode,setting,message", [
    ("native", "max_dendrites=-1", "max_dendrites must be >= 0"),
    ("compat", "n_epochs_to_switch=0", "n_epochs_to_switch must be >= 1"),
    ("native", "swich_mode=fixed", "did you mean 'switch_mode'"),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, capsys, mode, setting,
                                                             message):
    script = tmp_path / "train.py"
    script.write_text(source("plateau_enumerate"))
    assert main(["convert", "--write", "--mode", mode, "--set", setting, str(script)]) == 2
    assert message in capsys.readouterr().err
    assert script.read_text() == source("plateau_enumerate")
    assert not (tmp_path / "train.py.bak").exists()


def test_compat_switch_mode_names_become_the_gpa_constants():
    for value in ("fixed", "DOING_FIXED_SWITCH", "GPA.pc.DOING_FIXED_SWITCH"):
        out = convert_source(source("plateau_enumerate"), "compat",
                             settings={"switch_mode": value}).output
        assert "GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)" in out


def test_backups_are_never_overwritten(tmp_path, capsys):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text(source("while_epochs"))
    second.write_text(source("cnn_multistep"))
    (tmp_path / "a.py.bak").write_text("an older backup\n")
    assert main(["convert", "--write", str(first), str(second)]) == 0
    assert (tmp_path / "a.py.bak").read_text() == "an older backup\n"
    assert (tmp_path / "a.py.bak.1").read_text() == source("while_epochs")
    assert (tmp_path / "b.py.bak").read_text() == source("cnn_multistep")
    assert "perfora.perforate(classifier)" in first.read_text()
    assert "perfora.perforate(model)" in second.read_text()
    capsys.readouterr()
