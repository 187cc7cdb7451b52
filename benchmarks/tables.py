"""Regenerate the results tables of benchmarks/README.md from the JSON in benchmarks/results/.

Every table in benchmarks/README.md sits between two marker comments::

    <!-- table:NAME -->

    | ... the table, written by this script ... |

    <!-- /table -->

and NAME is one of ``TABLES`` below, each a function of the stored JSON. Text outside the
markers is left alone.

    python benchmarks/tables.py            # rewrite the tables in benchmarks/README.md
    python benchmarks/tables.py --check    # change nothing; exit 1 if a table is out of date
    python benchmarks/tables.py --print quality   # print one table

Run it after a benchmark has written new stored results (``benchmarks/overhead.py``,
``memory.py``, ``quality.py``, ``ddp.py``, ... with ``--update-stored``; without it they write
to the git-ignored ``benchmarks/results/local/``). The test suite runs ``--check``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tables_launch
import tables_quality

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

MARKER = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)",
                    flags=re.S)


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _rows(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------- training-step overhead
def _model_name(name: str) -> str:
    kind, _, rest = name.partition(" ")
    return f"{kind.upper()} {rest}"


def _overhead(result: dict[str, Any]) -> str:
    """One row per model and batch: K=0's ratio, then each K's ratio and ratio / ideal.

    A quick run (3 rounds) is rough, so its K=0 ratio gets 2 decimals instead of 3. Where the
    ratio over the ideal rounds to the target itself, the quartiles say on which side it is.
    """
    target = result["targets"]["ratio_over_ideal_max"]
    k0_digits = 2 if result.get("quick") else 3
    groups: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for row in result["rows"]:
        groups.setdefault((row["model"], row["batch"]), {})[row["K"]] = row
    ks = sorted({row["K"] for row in result["rows"]} - {0})
    header = ["model", "batch", "K=0"] + [f"K={k} (÷ ideal {k + 1})" for k in ks]
    out = []
    for (model, batch), by_k in groups.items():
        cells = [_model_name(model), str(batch), f"{by_k[0]['ratio']:.{k0_digits}f}x"]
        for k in ks:
            row = by_k[k]
            over = row["ratio"] / row["ideal"]
            note = ""
            if round(over, 2) == target:
                note = (f", q1–q3 {row['ratio_q1'] / row['ideal']:.2f}–"
                        f"{row['ratio_q3'] / row['ideal']:.2f}")
            cells.append(f"{row['ratio']:.2f}x ({over:.2f}{note})")
        out.append(cells)
    return _rows(header, out)


def table_overhead() -> str:
    """``overhead.py --threads 1 --clock cpu``: eager training step, ratio to the plain model."""
    return _overhead(_load("overhead.json"))


def table_overhead_unfused() -> str:
    """``overhead.py --unfused``: the same run with the plain autograd mix (the code before
    ``perfora.nn.kernels.FusedMix``)."""
    return _overhead(_load("overhead_unfused.json"))


def table_overhead_compiled() -> str:
    """``overhead.py --compile``: both sides under ``torch.compile``."""
    return _overhead(_load("overhead_compiled.json"))


def table_overhead_floor() -> str:
    """``overhead.py --floor``: per K, the perforated model's and the same-GEMM model's
    ratio over the FLOP ideal, measured in the same rounds."""
    result = _load("overhead_floor.json")
    groups: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for row in result["rows"]:
        groups.setdefault((row["model"], row["batch"]), {})[row["K"]] = row
    ks = sorted({row["K"] for row in result["rows"]} - {0})
    header = ["model", "batch"] + [f"K={k}: perforated / same GEMMs" for k in ks]
    out = []
    for (model, batch), by_k in groups.items():
        cells = [_model_name(model), str(batch)]
        for k in ks:
            row = by_k[k]
            cells.append(f"{row['measured_over_ideal']:.2f} / {row['floor_over_ideal']:.2f}")
        out.append(cells)
    return _rows(header, out)


# -------------------------------------------------------------------------- peak memory
def table_memory() -> str:
    """``memory.py``: peak training memory per configuration, against the plain model and
    against what the dendrites require by the formula (see the section)."""
    result = _load("memory.json")
    out = []
    for r in result["rows"]:
        fresh = r.get("ratio_to_fresh")
        out.append([_model_name(r["model"]), str(r["batch"]), r["variant"], f"{r['params']:,}",
                    f"{r['peak_mb']:.1f}", f"{r['ratio_to_plain']:.3f}x",
                    "" if r["variant"] == "plain" else f"{r['required_mb']:.1f}",
                    "" if r["variant"] in ("plain", "K=0") else f"{r['ratio_to_required']:.3f}x",
                    "" if fresh is None else f"{fresh:.3f}x"])
    return _rows(["model", "batch", "variant", "params", "peak MB", "vs plain", "required MB",
                  "vs required", "vs fresh K=5"], out)


# --------------------------------------------------------------------------- export speed
def table_export_speed() -> str:
    """``export_speed.py``: live / exported inference time over the plain model's, per K."""
    result = _load("export_speed.json")
    cases: dict[str, dict[int, dict[str, Any]]] = {}
    for row in result["rows"]:
        cases.setdefault(row["case"], {})[row["K"]] = row
    ks = sorted({row["K"] for row in result["rows"]})
    out = []
    for case, by_k in cases.items():
        kind, _, rest = case.partition("-")
        size, _, batch = rest.partition(" b")
        name = f"{kind.upper()} {size}, batch {batch}, live / exported"
        out.append([name] + [f"{by_k[k]['live']:.2f} / {by_k[k]['export']:.2f}" for k in ks])
    return _rows(["model"] + [f"K={k}" for k in ks], out)


# ------------------------------------------------------------------------------------ DDP
_DDP_NAMES = {"plain": "plain DDP, unconverted model"}


def _ddp_variant(name: str) -> str:
    if name in _DDP_NAMES:
        return _DDP_NAMES[name]
    if name.startswith("perfora "):
        return "perfora, " + name.removeprefix("perfora ")
    if name.startswith("find_unused "):
        return ("PerforatedAI's recipe (`find_unused_parameters=True`), "
                + name.removeprefix("find_unused "))
    return name


def table_ddp() -> str:
    """``ddp.py``: ms per step and ratios, 2 gloo ranks."""
    result = _load("ddp.json")
    out = []
    for row in result["rows"]:
        extra = row.get("ratio_to_perfora")
        out.append([_ddp_variant(row["variant"]), f"{row['ms_per_step']:.1f}",
                    f"{row['ratio_to_plain']:.2f}x", "" if extra is None else f"{extra:.2f}x"])
    return _rows(["variant", "ms/step", "vs plain DDP",
                  "`find_unused_parameters=True` vs perfora"], out)


def table_ddp_restructure() -> str:
    """``ddp.py``: one restructure in-process against one restart of the restart workflow."""
    result = _load("ddp.json")
    in_process = statistics.median(result["restructure_in_process_ms"])
    restart = statistics.median(result["restart_s"])
    return _rows(["one restructure in-process (median ms)", "one restart (median s)",
                  "restart / in-process"],
                 [[f"{in_process:.0f}", f"{restart:.1f}",
                   f"{result['restart_over_in_process']:.0f}x"]])


# -------------------------------------------------------------------------------- held-out
def table_heldout() -> str:
    """``heldout.py``: the grown model against a plain MLP of its size, early-stopped and
    trained as many epochs as the grown run (medians over seeds)."""
    result = _load("heldout.json")
    out = []
    for entry in result["summary"]:
        mine = [r for r in result["runs"] if r["dataset"] == entry["dataset"]]

        def med(arm: str, key: str, mine: list = mine) -> float:
            return statistics.median(r[arm].get(key, 0) for r in mine)

        out.append([entry["dataset"], f"{100 * entry['grown']:.1f}",
                    f"{med('grown', 'params'):.0f}", f"{med('grown', 'dendrites'):g}",
                    f"{med('grown', 'neurons'):g}", f"{100 * entry['plain']:.1f}",
                    f"{100 * entry['matched']:.1f}", f"{entry['gap']:+.1f}",
                    f"{entry['gap_matched']:+.1f}", f"{_heldout_paired(mine):+.1f}"])
    return _rows(["data set", "grown: median test acc", "params", "sets", "neuron steps",
                  "plain of that size, early-stopped", "plain of that size, grown's epochs",
                  "grown minus plain: early-stopped (points)", "same epochs (points)",
                  "same epochs, paired by seed (points)"], out)


def _heldout_paired(rows: list[dict[str, Any]]) -> float:
    """Median over seeds of grown minus the same-epochs plain network of that seed."""
    return statistics.median(100 * (r["grown"]["test"] - r["matched"]["test"]) for r in rows)


# ---------------------------------------------------------------------------- convert size
def table_convert_size() -> str:
    """``convert_size.py``: time and peak memory of ``perfora convert`` by script size."""
    result = _load("convert_size.json")
    out = []
    for row in result["rows"]:
        ratio = row["ratio_to_previous"]
        out.append([row["shape"], f"{row['bytes']:,}", f"{row['seconds']:.1f}",
                    f"{row['peak_mb']:,}", f"{row['seconds_per_mb']:.1f}",
                    "" if ratio is None else f"{ratio:.2f}x"])
    return _rows(["shape", "bytes", "seconds", "peak MB", "s per MB (after start-up)",
                  "work vs the previous size"], out)


# ------------------------------------------------------------------------------ GPU check
def table_gpu_step() -> str:
    """``gpu_check.py``: one training step on the GPU, K dendrites against the plain model."""
    result = _load("gpu_check_h200.json")["growth_on_cuda"]
    return _rows(["variant", "ms/step", "vs plain"],
                 [[name, f"{ms:.2f}", f"{result['step_ratio_vs_plain'][name]:.2f}x"]
                  for name, ms in result["step_ms"].items()])


def _run(entry: dict[str, Any]) -> str:
    if entry.get("rc") != 0:
        return "refused (`PerforaError`)" if "PerforaError" in entry.get("error", "") \
            else "failed"
    return f"{entry['num_dendrites']} sets, {entry['seconds']:.0f} s"


def table_gpu_runs() -> str:
    """``gpu_check.py``: the Lightning, DeepSpeed and FSDP1 runs on one GPU."""
    result = _load("gpu_check_h200.json")
    out = []
    for name in ("ddp_bf16", "model_parallel", "single_accumulate"):
        out.append([f"Lightning `{name}`", _run(result["lightning"][name]), "", ""])
    for name, key in (("deepspeed", "deepspeed_vs_ddp_max_diff"),
                      ("fsdp1", "fsdp1_vs_ddp_max_diff")):
        runs = result[name]
        out.append([f"Lightning `{name}`", _run(runs["full"]),
                    f"{runs['resumed_vs_full_max_diff']:g}", f"{runs[key]:g}"])
    out.append(["Lightning `deepspeed` ZeRO stage 3", _run(result["deepspeed"]["stage3"]),
                "", ""])
    return _rows(["run", "result", "resumed after a growth step vs uninterrupted (max diff)",
                  "vs `ddp` (max diff)"], out)


def table_gpu_growth() -> str:
    """``gpu_check.py``: growth on CUDA and over NCCL, outputs before and after."""
    result = _load("gpu_check_h200.json")
    cuda, nccl, err = result["growth_on_cuda"], result["nccl"], result["error_growth"]
    out = [[f"growth on CUDA, {name}", f"{cuda[name]['growth_output_change']:g}",
            "bf16 autocast gradients finite" if cuda[name]["bf16_grads_finite"] else ""]
           for name in ("mlp", "conv")]
    out.append(["DDP over NCCL", "", "re-wrapped" if nccl["ddp"]["rewrapped"] else ""])
    fsdp2 = nccl["fsdp2"]
    out.append(["FSDP2 over NCCL", f"{fsdp2['growth_output_change']:g}",
                f"resumed output diff {fsdp2['resumed_output_diff']:g}, optimizer state "
                + ("restored" if fsdp2["optimizer_state_restored"] else "lost")])
    for name in ("ddp_mlp", "ddp_conv", "fsdp2_mlp"):
        run = err[name]
        sets = ", ".join(f"`{layer}`: {'/'.join(map(str, fed))}"
                         for layer, fed in run["fed"].items())
        out.append([f"error-driven selective growth, {name.replace('_', ' ')}",
                    f"{run['output_change']:g}",
                    f"{run['dendrites']} half-width sets (neurons fed per set: {sets})"])
    out.append(["one growth plan for a "
                f"{err['plan_2048_wide_weight'][1]}-wide Linear", "",
                f"{err['plan_2048_wide_seconds']:.2f} s"])
    return _rows(["check", "largest output change at growth", "notes"], out)


def table_gpu_neurons() -> str:
    """``gpu_check.py --only neuron_growth compiled_growth``: neuron growth on CUDA and over
    NCCL, and a compiled model through six restructures."""
    result = _load("gpu_check_h200.json")
    neurons, compiled = result["neuron_growth"], result["compiled_growth"]
    out = []
    for name, what in (("mlp", "MLP"), ("cnn_bn", "CNN with BatchNorm")):
        run = neurons[name]
        out.append([f"neuron steps on CUDA, {what}", _exact(run["exact"]),
                    f"widths {run['widths']}, then a dendrite set and one more neuron step; "
                    + ("bf16 autocast gradients finite" if run["bf16_grads_finite"] else
                       "bf16 gradients NOT finite")])
    for name, what in (("ddp", "DDP"), ("fsdp2", "FSDP2")):
        run = neurons[name]
        out.append([f"neuron steps, {what} over NCCL", _exact(run["exact"]),
                    f"{run['wrapper']}, widths {run['widths']}; saved and loaded into a "
                    f"narrow model: output diff {run['resumed_output_diff']:g}, optimizer "
                    + ("restored" if run["optimizer_state_restored"] else "lost")])
    wide = neurons["widen_2048_pair"]
    out.append(["one neuron step of a 2048-wide pair", "",
                f"{wide['seconds'] * 1e3:.0f} ms (one training step: "
                f"{wide['train_step_ms']:.1f} ms)"])
    graphs = compiled["graphs_per_structure"]
    out.append(["`torch.compile` (inductor), 3 dendrite sets and 3 neuron steps",
                f"compiled vs eager {max(compiled['compiled_vs_eager_max_diff']):.1e}",
                f"graphs per structure {graphs} (one per grad mode; none ran eagerly)"])
    return _rows(["check", "output at each growth", "notes"], out)


def _exact(flags: list[bool]) -> str:
    return "bit-identical" if all(flags) else f"changed at {flags.count(False)} step(s)"


def table_model_sweep() -> str:
    """``model_sweep.py --device cuda``: real architectures through perforate, growth,
    training, export and widening."""
    return _model_sweep(_load("model_sweep_h200.json"))


def table_model_sweep_hf() -> str:
    """``model_sweep.py --models hf`` on the CPU: the Hugging Face models."""
    return _model_sweep(_load("model_sweep_hf.json"))


def _model_sweep(result: dict) -> str:
    out = []
    for row in result["rows"]:
        wrapped = ", ".join(f"{n} {k}" for k, n in row.get("wrapped", {}).items())
        grow = row.get("grow_output_change")
        widen = row.get("widen_output_change")
        out.append([f"`{row['model']}`", wrapped,
                    "" if grow is None else f"{grow:g}",
                    {True: "finite", False: "NOT finite"}.get(row.get("loss_finite"), ""),
                    "" if row.get("export_diff") is None else f"{row['export_diff']:.1e}",
                    row.get("widenable", ""),
                    "" if widen is None else f"{widen:g}",
                    row.get("error", "")[:60]])
    return _rows(["model", "wrapped", "output change at growth", "training loss",
                  "export vs live", "widenable layers", "output change at widening",
                  "error"], out)


# ------------------------------------------------------------------------------------ demo
def table_demo() -> str:
    """``perfora demo --json --seed S``: the arms, per seed (the same-budget arm where the
    stored run has it)."""
    result = _load("demo.json")
    out = []
    for seed, run in sorted(result["seeds"].items(), key=lambda item: int(item[0])):
        arms = {arm["name"]: arm for arm in run["arms"]}
        base, grown, wide = arms["baseline"], arms["grown"], arms["wider"]
        same = arms.get("wider-eq")

        def gap(other: dict | None, grown: dict = grown) -> str:
            if other is None:
                return "not run"
            return f"{100 * (grown['test_accuracy'] - other['test_accuracy']):+.1f} points"

        out.append([seed, f"{base['params']}, {base['test_accuracy']:.4f}",
                    f"{grown['params']}, {grown['dendrites']}, {grown['hidden_width']}, "
                    f"{grown['epochs']}, {grown['test_accuracy']:.4f}",
                    f"{run['wider_hidden']}, {wide['params']}, {wide['epochs']}, "
                    f"{wide['test_accuracy']:.4f}",
                    "" if same is None else f"{same['epochs']}, {same['test_accuracy']:.4f}",
                    gap(wide), gap(same)])
    return _rows(["seed", "baseline (params, test acc)",
                  "grown (params, sets, hidden width, epochs, test acc)",
                  "wider, early-stopped (hidden, params, epochs, test acc)",
                  "wider, grown's epochs (epochs, test acc)", "grown vs wider",
                  "grown vs wider, same epochs"], out)


# ------------------------------------------------------------------------ per-epoch cost
def table_epoch_cost() -> str:
    """``epoch_cost.py``: the perfora calls per epoch on the digits MLP, native and compat,
    with PerforatedAI's figure as quoted in issue 16 (not measured here)."""
    result = _load("epoch_cost.json")
    out = []
    for name, r in result["results"].items():
        sizes = r["json_bytes"]
        first, last = min(sizes, key=int), max(sizes, key=int)
        out.append([f"perfora {name}", f"{r['median_ms']:.2f}", f"{r['p90_ms']:.2f}",
                    f"{r['median_no_write_ms']:.2f}", f"{r['train_epoch_ms']:.1f}",
                    f"{100 * r['fraction']:.1f}%", f"{r['checkpoint_writes']} of {r['epochs']}",
                    f"{sizes[first]:,} → {sizes[last]:,} (epoch {first} → {last})"])
    quoted = result["quoted"]
    out.append(["PerforatedAI (quoted, not measured here)", "", "", "",
                f"~{quoted['perforatedai_epoch_ms']:g}",
                f"{100 * quoted['perforatedai_fraction']:.0f}%", "", ""])
    return _rows(["API", "median ms", "p90 ms", "median ms, no file written", "training epoch ms",
                  "share of the epoch", "epochs writing `latest`", "checkpoint JSON bytes"],
                 out)


# ------------------------------------------------------------------------ checkpoint IO
def table_checkpoint_io() -> str:
    """``checkpoint_io.py``: write and load time of one file against DCP, 2 gloo ranks."""
    result = _load("checkpoint_io.json")
    out = []
    for r in result["rows"]:
        out.append([f"{r['params'] / 1e6:.2f} M", f"{r['bytes']['file'] / 2**20:.1f}",
                    f"{r['bytes']['dcp'] / 2**20:.1f}", f"{r['file']['write']:.3f}",
                    f"{r['dcp']['write']:.3f}", f"{r['file']['load']:.3f}",
                    f"{r['dcp']['load']:.3f}"])
    return _rows(["params (K=1)", "file MB", "DCP MB", "write: file (s)", "write: DCP (s)",
                  "load: file (s)", "load: DCP (s)"], out)


# ------------------------------------------------------------------- restructure memory
def table_restructure_memory() -> str:
    """``restructure_memory.py``: peak MiB per rank, shard-local against gather-based."""
    result = _load("restructure_memory.json")
    mib, out = 2 ** 20, []
    for r in result["rows"]:
        p, ratio = r["peaks"], r["ratios"]
        widen = ([f"{r['steady_widen'] / mib:.0f}",
                  f"{p['widen'] / mib:.0f} ({ratio['widen']:.2f}x)"]
                 if "widen" in p else ["", ""])
        out.append([r["mode"], str(r["rank"]), f"{r['steady'] / mib:.0f}",
                    *(f"{p[op] / mib:.0f} ({ratio[op]:.2f}x)"
                      for op in ("snapshot", "grow", "rewind")), *widen])
    return _rows(["path", "rank", "steady MiB", "snapshot", "grow", "rewind",
                  "steady MiB with the widened model", "neuron step"], out)


TABLES: dict[str, Callable[[], str]] = {
    "overhead": table_overhead,
    "overhead-unfused": table_overhead_unfused,
    "overhead-compiled": table_overhead_compiled,
    "overhead-floor": table_overhead_floor,
    "memory": table_memory,
    "export-speed": table_export_speed,
    "ddp": table_ddp,
    "ddp-restructure": table_ddp_restructure,
    **tables_quality.TABLES,
    "heldout": table_heldout,
    "convert-size": table_convert_size,
    "gpu-step": table_gpu_step,
    "gpu-growth": table_gpu_growth,
    "gpu-runs": table_gpu_runs,
    "gpu-neurons": table_gpu_neurons,
    "model-sweep": table_model_sweep,
    "model-sweep-hf": table_model_sweep_hf,
    "demo": table_demo,
    "epoch-cost": table_epoch_cost,
    "checkpoint-io": table_checkpoint_io,
    "restructure-memory": table_restructure_memory,
    **tables_launch.TABLES,
}


def render(text: str) -> str:
    """``text`` with every marked table regenerated; an unknown or missing name is an error."""
    seen = set()

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"tables.py: unknown table {name!r} in {README.name}; known: "
                             f"{', '.join(TABLES)}")
        seen.add(name)
        # blank lines around the table: Markdown must not read it as part of the comment
        return f"{match.group(1)}\n{TABLES[name]()}\n\n{match.group(4)}"

    out = MARKER.sub(fill, text)
    missing = set(TABLES) - seen
    if missing:
        raise SystemExit(f"tables.py: {README.name} has no marker for "
                         f"{', '.join(sorted(missing))} (<!-- table:NAME --> ... "
                         f"<!-- /table -->)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a table differs from the JSON")
    parser.add_argument("--print", dest="show", choices=list(TABLES), metavar="NAME",
                        help=f"print one table: {', '.join(TABLES)}")
    parser.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.show:
        print(TABLES[args.show]())
        return 0
    text = args.readme.read_text()
    new = render(text)
    if args.check:
        if new != text:
            diff = difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                        str(args.readme), "regenerated from the JSON")
            sys.stdout.writelines(diff)
            print(f"\n{args.readme} is out of date: run python benchmarks/tables.py",
                  file=sys.stderr)
            return 1
        print(f"{args.readme}: {len(MARKER.findall(text))} tables match the JSON")
        return 0
    if new != text:
        args.readme.write_text(new)
        print(f"rewrote the tables in {args.readme}")
    else:
        print(f"{args.readme}: tables already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
