"""Width-curve benchmark: grow the network (dendrites, neurons), or just train it wider?

Every grown arm is compared with the *same* plain network at several widths, trained the
same way, at the arm's own parameter count, in two ways: early-stopped, and for as many
epochs as the arm trained.

Method. Each task (``quality_tasks.py``) gives train/val/test tensors and a model builder
taking a width (hidden units, or channels for the CNN). Each **arm** (``ARMS``: PerforaConfig
overrides) grows the narrow start-width network. The plain network is trained at 6 widths
(``WIDTH_MULTIPLIERS`` times the start width) twice:

- the **width curve** (``vs_curve``): perfora's controller with ``max_dendrites=0``, i.e.
  pure early stopping, as an arm stops;
- the **matched-budget curve** (``vs_matched``): no early stopping; on each seed a width
  trains as many epochs as the arm did on that seed (one run per width and seed trains the
  longest arm's epochs, and records the test accuracy at each new best validation score, so
  every shorter budget is a prefix of it).

All runs share the optimizer (Adam, lr 0.01, rebuilt after every restructure), batch size,
patience, improvement threshold (1e-3, ``--improvement-threshold``; the library's default is
1e-4) and epoch cap; the controller sees the validation loss, and
a run's score is the test accuracy at its best validation epoch. Per task, arm and curve
point: median and quartiles of that accuracy over seeds, median parameter count. An arm's
``vs_curve`` and ``vs_matched`` are its median minus the curve's median accuracy at the
arm's median parameter count (linear in log(params) between curve points; "beyond" when
outside the curve's range, clamped to the end point); ``vs_start`` is its median minus the
start width's (the 1x point of the early-stopped curve). ``vs_matched_paired`` (and
``vs_curve_paired``) pair the seeds instead: the median over seeds of a run's accuracy
minus its own seed's curve at the run's own parameter count. All in accuracy points (x100).
The **width search** treats the early-stopped curve as a user's width sweep: its best width
and total epochs, against one grown run, judged by its final accuracy and epochs and, from its
``trace`` (every run records one), cut where its seed's sweep ends. The **targets** table
judges ``TARGET_ARMS``.

Caps: ``--quick`` 3 seeds, patience 8, max_dendrites (and neuron steps) 2, epoch cap 150;
full 5 seeds, patience 10, 4 sets or steps, epoch cap 2000 (spirals: patience and cap x5).

    python benchmarks/quality.py --quick                 # smoke run, --jobs 2 (2 cores)
    python benchmarks/quality.py                         # full run: about an hour or more
    python benchmarks/quality.py --summarize a.json b.json   # runs made apart, together
    python benchmarks/quality.py --datasets wine digits --arms gd --seeds 2
    python benchmarks/quality.py --arms custom --set rule=correlation --set activation=tanh
    python benchmarks/quality.py --quick --no-curve --out-dir /tmp/q   # arms only

Outputs: markdown tables on stdout, progress on stderr, JSON (``quality.json`` or
``quality_quick.json``; ``--json`` overrides) and ``pareto_<task>.png``
(``pareto_<task>_quick.png`` for ``--quick``) in ``results/local/`` (git-ignored), or in the
stored ``results/`` with ``--update-stored``; ``--out-dir`` redirects both.

``--quick`` is a smoke run of the script, not a smaller benchmark: with 3 seeds, at most 2
sets and 150 epochs its numbers differ from the full run's (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import output_paths
import quality_report as rep
import quality_stats as qs
import settings_arg
import torch
from quality_tasks import (
    COST,
    NAMED_ONLY,
    TASKS,
    WIDTH_MULTIPLIERS,
    Task,
    curve_widths,
    default_tasks,
    load_task,
)
from torch import nn

from perfora import ConfigError, GrowthController, PerforaConfig, perforate

ARMS: dict[str, dict[str, Any]] = {
    # perfora 0.1's default and rule (PerforatedAI's growth: every neuron, random init, a
    # failed set discarded and retried)
    "gd": {"growth": "dendrites", "rule": "gd", "dendrite_init": "default",
           "grow_fraction": 1.0, "retain_all_dendrites": False},
    "correlation": {"growth": "dendrites", "rule": "correlation", "dendrite_init": "default",
                    "grow_fraction": 1.0, "retain_all_dendrites": False},
    # the variants tried for "growth that spends parameters where they pay"
    "error_init": {"growth": "dendrites", "dendrite_init": "error", "grow_fraction": 1.0,
                   "retain_all_dendrites": False},
    "selective": {"growth": "dendrites", "dendrite_init": "error", "grow_fraction": 0.5,
                  "retain_all_dendrites": False},
    "selective_random": {"growth": "dendrites", "dendrite_init": "default",
                         "grow_fraction": 0.5, "retain_all_dendrites": False},
    "selective_retain": {"growth": "dendrites", "dendrite_init": "error", "grow_fraction": 0.5,
                         "retain_all_dendrites": True},
    "relu_error_retain": {"growth": "dendrites", "dendrite_init": "error",
                          "grow_fraction": 1.0, "retain_all_dendrites": True,
                          "activation": "relu"},
    "output_layer_only": {"growth": "dendrites", "dendrite_init": "error",
                          "output_only": True},
    # "grow until the training set is learned" (two spirals): the controller sees the
    # training accuracy (or loss) and stops growing at the target
    "learn_train_acc": {"growth": "dendrites", "score": "train_accuracy", "maximize": True,
                        "max_dendrites": 20, "target_score": 1.0, "tasks": ["spirals"]},
    "learn_train_loss": {"growth": "dendrites", "score": "train_loss", "max_dendrites": 20,
                         "target_score": 0.01, "tasks": ["spirals"]},
    # neurons instead of dendrites: each growth step adds the start width to every layer
    # that can widen (neurons_per_step 1.0), new rows GradMax-initialized or random
    "neurons_gradmax": {"growth": "neurons", "neuron_init": "gradmax"},
    "neurons_random": {"growth": "neurons", "neuron_init": "random"},
    # dendrites alone: perfora's default until growth='auto' measured better
    "dendrites": {"growth": "dendrites"},
    # perfora's own choice between dendrites and neurons, by the validation score
    "auto": {"growth": "auto"},
    # PerforaConfig's defaults, what perforate() + GrowthController give (today: growth
    # 'auto', dendrite_init "error", grow_fraction 1.0, retain_all_dendrites True)
    "default": {},
}
"""Grown arms: name -> PerforaConfig overrides, applied on top of the harness settings.
Keys of the harness's own (``HARNESS_KEYS``): ``score`` ("val_loss", the default,
"train_loss" or "train_accuracy": the score the controller sees), ``tasks`` (run the arm on
these tasks only) and ``output_only`` (perforate the last Linear only). An arm the installed
perfora rejects (e.g. a setting it does not have yet) is skipped with a line on stderr."""

HARNESS_KEYS = ("score", "tasks", "output_only")
SCORES = ("val_loss", "train_loss", "train_accuracy", "val_accuracy")
"""The scores the controller can be given (``score``)."""

QUICK_ARMS = ("gd", "output_layer_only", "learn_train_acc", "neurons_gradmax",
              "neurons_random", "default")
"""``--quick``'s arms (without ``--arms``): every code path of the harness (random and
error-driven sets, output layer only, a training score, neurons; ``auto`` is ``default``
now). Every task is over 200 runs (tens of minutes on 2 cores); one task
(``--datasets wine``) takes under a minute."""

CURVE: tuple[tuple[str, Any], ...] = (("max_dendrites", 0),)
"""Overrides of the width curve's runs: no dendrites, i.e. plain early stopping."""


# ------------------------------------------------------------------------ training
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(cross-entropy loss, accuracy)."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        return (nn.functional.cross_entropy(out, y).item(),
                (out.argmax(1) == y).float().mean().item())


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor, gen: torch.Generator, batch: int) -> None:
    model.train()
    order = torch.randperm(len(x), generator=gen)
    for i in range(0, len(x), batch):
        idx = order[i:i + batch]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()


@dataclass
class Setup:
    """Training shared by every run (scaled per task by ``Task.scale``)."""

    patience: int
    max_dendrites: int
    max_epochs: int
    lr: float = 0.01
    improvement_threshold: float = 1e-3


def make_config(setup: Setup, scale: int, seed: int, overrides: dict[str, Any]) -> PerforaConfig:
    """Harness settings, then the arm's overrides (which win). Neuron growth gets as many
    steps as dendrite growth gets sets."""
    base: dict[str, Any] = {
        "maximize": False, "n_epochs_to_switch": setup.patience * scale,
        "improvement_threshold": setup.improvement_threshold, "seed": seed,
        "save_checkpoints": False, "max_dendrites": setup.max_dendrites}
    if overrides.get("growth", PerforaConfig().growth) != "dendrites":  # the default: auto
        base["max_neuron_steps"] = setup.max_dendrites
    return PerforaConfig(**{**base, **overrides})


def run_controller(task: Task, width: int, seed: int, setup: Setup,
                   overrides: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
    """One controller-driven run of the ``width`` network: score, params, epochs, seconds,
    and the (epoch, test accuracy) of every new best validation score in ``trace``. With
    ``budget``: exactly ``budget`` epochs, no early stopping and no growth."""
    torch.manual_seed(seed)
    x, y = task.splits["train"]
    score_name = overrides.pop("score", "val_loss")
    overrides.pop("tasks", None)
    output_only = overrides.pop("output_only", False)
    if score_name not in SCORES:
        raise ValueError(f"score={score_name!r}: the harness scores {', '.join(SCORES)}")
    if score_name not in ("val_loss", "train_loss"):
        overrides.setdefault("maximize", True)
    if budget is not None:
        overrides.update(max_dendrites=0, n_epochs_to_switch=budget + 1)
    config = make_config(setup, task.scale, seed, overrides)
    net = task.build(width)
    last = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)][-1]
    # the controller applies config.activation
    model = perforate(net, paths=[last]) if output_only else perforate(net)
    ctl = GrowthController(model, config, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=setup.lr)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(seed)
    trace: list[list[float]] = []
    start = time.perf_counter()
    for _ in range(budget if budget is not None else setup.max_epochs * task.scale):
        train_epoch(model, opt, x, y, gen, task.batch)
        val_loss, val_acc = evaluate(model, *task.splits["val"])
        _, test_acc = evaluate(model, *task.splits["test"])
        if score_name in ("train_accuracy", "train_loss"):
            train_loss, train_acc = evaluate(model, x, y)
            score = train_acc if score_name == "train_accuracy" else train_loss
        else:
            score = val_acc if score_name == "val_accuracy" else val_loss
        decision = ctl.step(score, test_score=test_acc)
        if ctl.state.best_epoch == ctl.state.epoch:
            trace.append([ctl.state.epoch, ctl.state.best_test])
        if decision.complete:
            break
        if decision.restructured:
            opt = decision.optimizer
    seconds = time.perf_counter() - start
    params, dendrites = ctl.parameter_count(), ctl.num_dendrites
    neurons = getattr(ctl.state, "num_widenings", 0)  # neuron growth steps the model holds
    if not ctl.completed and ctl.best_snapshot is not None:
        # stopped by the epoch cap: score and size are the best checkpoint's, which may lack
        # a dendrite set still on trial in the live model
        structure, tensors = ctl.best_snapshot
        names = {name for name, _ in model.named_parameters()}
        params = sum(t.numel() for name, t in tensors.items() if name in names)
        dendrites = max((s["num_dendrites"] for s in structure.values()), default=0)
        neurons = max((len(s.get("widened") or []) for s in structure.values()), default=0)
    row = {"test": ctl.state.best_test, "params": params, "dendrites": dendrites,
           "neurons": neurons, "epochs": ctl.epoch,
           "capped": budget is None and not ctl.completed, "seconds": seconds,
           "trace": trace}
    return row


@dataclass(frozen=True)
class Job:
    """One independent run: a curve width (``arm`` None; with ``budget``, a matched-budget
    run) or an arm on the start width."""

    task: str
    seed: int
    width: int
    arm: str | None
    overrides: tuple[tuple[str, Any], ...]
    setup: Setup
    budget: int | None = None

    @property
    def name(self) -> str:
        return self.arm if self.arm is not None else f"width {self.width}"

    @property
    def kind(self) -> str:
        return "arm" if self.arm is not None else ("curve" if self.budget is None
                                                   else "matched")


def _frozen(overrides: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Hashable overrides (lists become tuples) for a Job."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in overrides.items()))


def run_job(job: Job) -> dict[str, Any]:
    """Run one job; seeded by itself, so results do not depend on the pool or its order. A
    run that raises gives a row with ``error`` (reported, left out of the statistics)."""
    task = load_task(job.task, job.seed)
    row = {"task": job.task, "seed": job.seed, "kind": job.kind, "name": job.name,
           "width": job.width}
    try:
        return {**row, **run_controller(task, job.width, job.seed, job.setup,
                                        dict(job.overrides), job.budget)}
    except Exception as exc:  # noqa: BLE001 - one failing arm must not end the benchmark
        return {**row, "error": f"{type(exc).__name__}: {exc}"}


def _worker_init() -> None:
    torch.set_num_threads(1)


def _run_indexed(item: tuple[int, Job]) -> tuple[int, dict[str, Any]]:
    return item[0], run_job(item[1])


def _cost(job: Job) -> float:
    length = job.budget / 100 if job.budget is not None else (3 if job.arm else 1)
    return COST.get(job.task, 1) * length


def run_all(jobs: list[Job], n_jobs: int) -> list[dict[str, Any]]:
    """Run every job (in a process pool when ``n_jobs`` > 1), printing progress to stderr."""
    order = sorted(enumerate(jobs), key=lambda ij: (-_cost(ij[1]), ij[1].task))
    done: dict[int, dict[str, Any]] = {}

    def report(index: int, row: dict[str, Any]) -> None:
        done[index] = row
        head = f"[{len(done)}/{len(jobs)}] {row['task']} seed {row['seed']} {row['name']}"
        if "error" in row:
            print(f"{head} ({row['kind']}): FAILED: {row['error']}", file=sys.stderr,
                  flush=True)
            return
        print(f"{head}{' (matched)' if row['kind'] == 'matched' else ''}: acc "
              f"{row['test']:.3f}, {row['params']} params, {row['dendrites']} dendrites, "
              f"{row['neurons']} neuron steps, {row['epochs']} epochs, {row['seconds']:.1f} s",
              file=sys.stderr, flush=True)

    if not jobs:
        return []
    if n_jobs <= 1:
        _worker_init()
        for item in order:
            report(*_run_indexed(item))
    else:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(n_jobs, initializer=_worker_init) as pool:
            for index, row in pool.imap_unordered(_run_indexed, order):
                report(index, row)
    return [done[i] for i in range(len(jobs))]


def matched_jobs(rows: list[dict[str, Any]], setup: Setup) -> list[Job]:
    """One no-early-stopping run per curve width and seed, as long as that seed's longest arm
    (every arm's budget is a prefix of it)."""
    longest: dict[tuple[str, int], int] = {}
    for r in rows:
        if r["kind"] == "arm" and "error" not in r:
            key = (r["task"], r["seed"])
            longest[key] = max(longest.get(key, 0), r["epochs"])
    return [Job(task, seed, w, None, CURVE, setup, budget)
            for (task, seed), budget in longest.items()
            for w in curve_widths(load_task(task, 0).width)]


# --------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, short caps")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5)")
    parser.add_argument("--datasets", nargs="+", choices=list(TASKS), default=None,
                        metavar="TASK", help=f"subset of tasks: {', '.join(TASKS)} (by default "
                        f"all but {', '.join(NAMED_ONLY)}, run when named)")
    parser.add_argument("--arms", nargs="+", default=None, metavar="NAME",
                        help=f"subset of arms: {', '.join(ARMS)} (and custom with --set)")
    settings_arg.add_set_argument(
        parser, help="define arm 'custom' (PerforaConfig overrides, JSON values)")
    parser.add_argument("--improvement-threshold", type=float, default=1e-3, metavar="REL",
                        help="the relative margin every run (curves and arms) must beat its "
                             "best by (default 1e-3; the library's own default is 1e-4)")
    parser.add_argument("--no-curve", action="store_true", help="skip both width curves")
    parser.add_argument("--jobs", type=int, default=2, help="parallel runs (default 2)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="for JSON and PNGs (default benchmarks/results/local/; with "
                             "--update-stored benchmarks/results/)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write results (default OUT_DIR/quality.json, "
                             "quality_quick.json for --quick)")
    output_paths.add_update_stored(parser)
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="JSON",
                        help="no runs: redo the tables, plots and summary of saved JSON "
                             "(several: their runs together, e.g. tasks run apart; written to "
                             "OUT_DIR under the first one's name)")
    return parser


def out_dir(args: argparse.Namespace) -> Path:
    """The folder of the plots (and of the JSON without --json)."""
    return args.out_dir or output_paths.results_dir(args.update_stored)


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --json, else in :func:`out_dir`."""
    if args.json:
        return args.json
    if args.summarize is not None:
        return out_dir(args) / args.summarize[0].name
    return out_dir(args) / ("quality_quick.json" if args.quick else "quality.json")


def _accepted_arms(parser: argparse.ArgumentParser, arms: dict[str, dict[str, Any]],
                   selected: list[str], setup: Setup) -> tuple[list[str], dict[str, str]]:
    """The selected arms the installed perfora accepts, and why each other one is skipped
    (a custom arm's bad setting is an error of the command line instead)."""
    kept, skipped = [], {}
    for name in selected:
        score = arms[name].get("score", "val_loss")
        if score not in SCORES:
            parser.error(f"arm {name!r}: score={score!r}: the harness scores "
                         f"{', '.join(SCORES)}")
        try:
            make_config(setup, 1, 0, {k: v for k, v in arms[name].items()
                                      if k not in HARNESS_KEYS})
        except (ConfigError, TypeError, ValueError) as exc:  # TypeError: unknown setting
            if name == "custom":
                parser.error(f"arm {name!r}: {exc}")
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"skipping arm {name!r}: the installed perfora rejects its settings "
                  f"{arms[name]} ({skipped[name]})", file=sys.stderr, flush=True)
            continue
        kept.append(name)
    return kept, skipped


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables, write the JSON and the plots."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.summarize is not None:
        rows, setup, total = qs.merge_saved([json.loads(p.read_text()) for p in args.summarize])
        report(rows, setup, total, out_dir(args), output_path(args))
        return 0

    arms = dict(ARMS)
    if args.set:
        arms["custom"] = settings_arg.parse_settings(parser, args.set)
    selected = args.arms if args.arms is not None else list(QUICK_ARMS if args.quick else ARMS)
    if args.set and "custom" not in selected:  # --set defines the arm: run it, said
        print("--set defines the arm 'custom': running it (with the arms selected)",
              file=sys.stderr)
        selected = [*selected, "custom"]
    for name in selected:
        if name not in arms:
            parser.error(f"unknown arm {name!r}; known: {', '.join(arms)}")
    if not args.improvement_threshold >= 0:
        parser.error(f"--improvement-threshold {args.improvement_threshold}: give a "
                     "non-negative number")
    if args.quick:
        setup = Setup(patience=8, max_dendrites=2, max_epochs=150,
                      improvement_threshold=args.improvement_threshold)
    else:
        setup = Setup(patience=10, max_dendrites=4, max_epochs=2000,
                      improvement_threshold=args.improvement_threshold)
    selected, skipped = _accepted_arms(parser, arms, selected, setup)
    seeds = list(range(args.seeds or (3 if args.quick else 5)))
    tasks = args.datasets or default_tasks()

    jobs = []
    for task in tasks:
        start = load_task(task, 0).width  # cheap; forked workers inherit the cache
        for seed in seeds:
            if not args.no_curve:
                jobs += [Job(task, seed, w, None, CURVE, setup) for w in curve_widths(start)]
            jobs += [Job(task, seed, start, name, _frozen(arms[name]), setup)
                     for name in selected if task in arms[name].get("tasks", [task])]
    began = time.perf_counter()
    rows = run_all(jobs, args.jobs)
    matched = [] if args.no_curve else matched_jobs(rows, setup)
    print(f"matched-budget curve: {len(matched)} runs", file=sys.stderr, flush=True)
    rows += run_all(matched, args.jobs)
    total = time.perf_counter() - began

    setup_info = {**asdict(setup), "seeds": seeds, "quick": args.quick,
                  "width_multipliers": list(WIDTH_MULTIPLIERS),
                  "arms": {name: arms[name] for name in selected}, "skipped_arms": skipped,
                  "curve": not args.no_curve, "jobs": args.jobs, "torch": torch.__version__,
                  "runs": len(jobs) + len(matched)}
    report(rows, setup_info, total, out_dir(args), output_path(args))
    return 0


def report(rows: list[dict[str, Any]], setup: dict[str, Any], total: float, out_dir: Path,
           out: Path) -> None:
    """Print the tables, draw the plots and write the JSON of a finished set of runs."""
    summaries = qs.summarize(rows)
    for name, summary in summaries.items():
        print(rep.task_table(name, summary) + "\n")
    overview = qs.summary_rows(summaries)
    print("### summary (points of test accuracy; vs_curve: arm minus the early-stopped width "
          "curve at the arm's params; vs_matched: minus the curve trained as many epochs as "
          "the arm; counts: at or above the early-stopped curve, grown in the median run, and "
          "at least 1 point above the start)\n")
    print(rep.summary_table(overview))
    print("\n### width search (the early-stopped curve as a user's sweep: best width by median "
          "test accuracy, sum of its widths' epochs; median over seeds)\n")
    print(rep.width_search_table(summaries, qs.TARGET_ARMS))
    targets = qs.target_rows(summaries)
    print("\n### targets (medians over seeds, test accuracy at the best validation epoch)\n")
    print(rep.targets_table(targets))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"FAILED: {r['task']} seed {r['seed']} {r['name']}: {r['error']}")
    for name, reason in setup.get("skipped_arms", {}).items():
        print(f"skipped arm {name}: {reason}")
    print(f"\n{len(setup['seeds'])} seed(s), patience {setup['patience']}, max_dendrites "
          f"{setup['max_dendrites']}, epoch cap {setup['max_epochs']} (spirals: patience and "
          f"cap x5); {len(rows)} runs ({len(errors)} failed), {setup['jobs']} job(s); total "
          f"{total:.0f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, summary in summaries.items():
        # quick runs draw beside the full run's plots, never over them
        suffix = "_quick" if setup.get("quick") else ""
        rep.plot(name, summary, out_dir / f"pareto_{name}{suffix}.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": setup, "total_seconds": total, "summary": overview,
                               "targets": targets, "tasks": summaries, "runs": rows},
                              indent=1))
    print(f"\nwrote {out} and the plots in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
