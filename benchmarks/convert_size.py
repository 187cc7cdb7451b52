"""How `perfora convert` scales with the size of the script: time and peak memory.

Generates training scripts of a given size in three shapes, from the converter's own test
corpus (``tests/scripts/convert_corpus/``):

- ``functions``: one real training script plus many helper functions (an evaluation loop and
  a one-epoch training loop each) until the size is reached;
- ``repeated``: the whole script (data, evaluation, ``main`` with its optimizer, scheduler and
  epoch loop) repeated under new names: many optimizers, which the converter reports;
- ``flat``: a module-level script (no functions) whose training code is repeated: many
  module-level epoch loops in one scope.

Each file is converted by the real command line in a fresh process (``perfora convert
--max-size 0 FILE``, the diff to /dev/null); the table gives the wall time, the child's peak
memory (``ru_maxrss``) and the time per MB, and the ratio of times between consecutive
sizes (2.0 for a doubling = linear). ``--src DIR`` runs another checkout of perfora (e.g. an
older commit from ``git archive``) for a before/after comparison.

    python benchmarks/convert_size.py                          # 4 sizes x 3 shapes, ~3 min
    python benchmarks/convert_size.py --sizes 5000000 --shapes functions
    python benchmarks/convert_size.py --src /tmp/old --out /tmp/convert_size_old.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import output_paths

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "scripts" / "convert_corpus"
OUTPUT = "convert_size.json"
SHAPES = ("functions", "repeated", "flat")
HELPERS = '''

def evaluate_{i}(model, loader):
    """Accuracy on a loader (copy {i})."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for xb, yb in loader:
            correct += (model(xb).argmax(1) == yb).sum().item()
            total += len(yb)
    return correct / total


def train_epoch_{i}(model, loader, optimizer, criterion):
    """One epoch (copy {i})."""
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
    return loss.item()
'''


def generate(shape: str, size: int) -> str:
    """A syntactically valid training script of about ``size`` bytes in the given shape."""
    if shape == "flat":
        text = (CORPUS / "single_noargparse_sgd.py").read_text()
        head, sep, body = text.partition("gen = ")
        parts, i = [head], 0
        while sum(map(len, parts)) < size:
            parts.append(f"\n# copy {i}\n" + sep + body)
            i += 1
        return "".join(parts)
    text = (CORPUS / "single_argparse_steplr.py").read_text()
    head, sep, tail = text.partition("\n\nif __name__")
    defs = head.split("\n\n\n", 1)[1]
    parts, i = [head], 0
    while sum(map(len, parts)) < size:
        if shape == "functions":
            parts.append(HELPERS.format(i=i))
        else:
            parts.append("\n\n" + defs.replace("def main", f"def main_{i}")
                         .replace("make_data", f"make_data_{i}")
                         .replace("evaluate", f"evaluate_{i}"))
        i += 1
    return "".join(parts) + sep + tail


def convert(path: Path, src: Path, timeout: float) -> dict:
    """Run ``perfora convert`` on one file in a fresh process: seconds, peak MB, exit code."""
    env = dict(os.environ, PYTHONPATH=str(src))
    # an older checkout without --max-size converts any size
    code = ("import inspect, sys; import perfora.cli as cli; "
            "limit = ['--max-size', '0'] if '--max-size' in inspect.getsource(cli) else []; "
            f"sys.exit(cli.main(['convert', *limit, {str(path)!r}]))")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=src,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            return {"seconds": None, "peak_mb": usage.ru_maxrss / 1024, "exit": "timeout"}
        time.sleep(0.05)
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 2), "peak_mb": round(usage.ru_maxrss / 1024),
            "exit": os.waitstatus_to_exitcode(status)}


def startup(src: Path) -> float:
    """Seconds to start Python and import the command line (subtracted per MB)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import perfora.cli, perfora.cli.convert"],
                   env=env, cwd=src, check=True)
    return time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[125_000, 250_000, 500_000, 1_000_000])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--src", type=Path, default=ROOT,
                        help="the perfora checkout to run (default: this one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per file")
    output_paths.add_output_options(parser, OUTPUT, "--out")
    return parser


def output_path(args: argparse.Namespace) -> Path:
    """Where the JSON goes: --out, else results/local/ (results/ with --update-stored)."""
    return output_paths.output_file(args, OUTPUT, "out")


def main(argv: list[str] | None = None) -> None:
    """Generate, convert, print the table and write the JSON."""
    args = build_parser().parse_args(argv)
    base = startup(args.src)
    rows = []
    print(f"startup (python + imports): {base:.2f} s")
    print(f"{'shape':<10} {'bytes':>10} {'seconds':>8} {'peak MB':>8} {'s/MB':>6} "
          f"{'x prev':>6} exit")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            prev = None
            for size in sorted(args.sizes):
                path = Path(tmp) / f"{shape}_{size}.py"
                text = generate(shape, size)
                path.write_text(text)
                res = convert(path, args.src, args.timeout)
                nbytes = len(text.encode())
                work = None if res["seconds"] is None else max(res["seconds"] - base, 0.0)
                per_mb = None if work is None else round(work / (nbytes / 1e6), 1)
                ratio = None if work is None or not prev else round(work / prev, 2)
                rows.append({"shape": shape, "bytes": nbytes, **res,
                             "seconds_per_mb": per_mb, "ratio_to_previous": ratio})
                print(f"{shape:<10} {nbytes:>10,} {res['seconds'] or float('nan'):>8.2f} "
                      f"{res['peak_mb']:>8.0f} {per_mb or float('nan'):>6.1f} "
                      f"{ratio or float('nan'):>6.2f} {res['exit']}", flush=True)
                prev = work
    out = output_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "perfora convert --max-size 0 FILE (diff to /dev/null), fresh process each",
        "src": str(args.src), "startup_seconds": round(base, 2),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
