"""`perfora demo` as a user runs it (its usage errors in process), and the README's example
as a user copies it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perfora.cli import main
from perfora.cli.demo import format_table, run_demo, run_files_line
from tests.support.paths import ROOT
from tests.support.script_server import ScriptServer

ROOT = ROOT


@pytest.mark.timeout(300)
def test_demo_json_reports_four_arms_and_writes_run_files(tmp_path: Path,
                                                          script_server: ScriptServer) -> None:
    out = tmp_path / "runs"
    proc = script_server.run("-m perfora.cli", "demo", "--json", "--seed", "1", "--out",
                             str(out), "--patience", "4", "--max-dendrites", "2",
                             cwd=tmp_path / "job", timeout=240)  # shorter than the default job
    assert proc.ok, proc.log()[-3000:]
    result = json.loads(proc.log().strip().splitlines()[-1])
    arms = {a["name"]: a for a in result["arms"]}
    assert set(arms) == {"baseline", "grown", "wider", "wider-eq"}
    for arm in arms.values():
        assert isinstance(arm["params"], int) and arm["params"] > 0
        assert isinstance(arm["epochs"], int) and arm["epochs"] > 0
        assert 0.0 <= arm["test_accuracy"] <= 1.0 and 0.0 <= arm["val_accuracy"] <= 1.0
        assert arm["seconds"] > 0
        for name in ("metrics.csv", "best_arch_scores.csv", "history.png", "run.json",
                     "best.safetensors", "latest.safetensors"):
            assert (out / arm["name"] / name).is_file(), name
        rows = (out / arm["name"] / "metrics.csv").read_text().strip().splitlines()
        assert len(rows) == arm["epochs"] + 1  # header + one row per epoch
    base, grown = arms["baseline"], arms["grown"]
    assert base["dendrites"] == base["neuron_steps"] == 0
    assert base["hidden_width"] == result["hidden"]
    # The grown arm trains at least as long as the baseline (same patience, same seed: its
    # first cycle is the baseline run), and its size is what it grew: each neuron step widens
    # the hidden layer by its starting width; each dendrite set adds a copy of both layers,
    # and a cascade weight per neuron from the second set on
    assert grown["epochs"] >= base["epochs"]
    hidden = result["hidden"] * (1 + grown["neuron_steps"])
    assert grown["hidden_width"] == hidden
    plain = 64 * hidden + hidden + hidden * 10 + 10
    sets = grown["dendrites"] * (64 * hidden + hidden + hidden + hidden * 10 + 10 + 10)
    cascade = max(grown["dendrites"] - 1, 0) * (hidden + 10)  # each later set reads the earlier
    assert grown["params"] == plain + sets + cascade
    if grown["dendrites"] or grown["neuron_steps"]:
        assert list((out / "grown").glob("switch_*.safetensors"))
    # how it grew: the steps it kept, in order, add up to the model it returned
    kept = grown["growth"].split(";")[0]
    for kind, count in (("dendrite set", grown["dendrites"]),
                        ("neuron step", grown["neuron_steps"])):
        assert sum(int(n) for n in re.findall(rf"(\d+) {kind}", kept)) == count, grown["growth"]
    # the third arm is the plain network whose size is closest to the grown one
    wide = arms["wider"]
    assert wide["dendrites"] == wide["neuron_steps"] == 0
    assert wide["hidden_width"] == result["wider_hidden"] >= result["hidden"]
    assert abs(wide["params"] - grown["params"]) <= (64 + 1 + 10) // 2
    # the fourth is that network trained as many epochs as the grown one (the same budget,
    # no early stopping), ending on its best validation epoch
    same = arms["wider-eq"]
    assert same["epochs"] == grown["epochs"] and same["params"] == wide["params"]
    vals = [float(row.split(",")[3]) for row in
            (out / "wider-eq" / "metrics.csv").read_text().strip().splitlines()[1:]]
    assert len(vals) == grown["epochs"] and same["val_accuracy"] == pytest.approx(max(vals))
    # the line the table ends with names the folders the run files are in
    named = run_files_line(result, out).split(") in ", 1)[1].replace(" and ", ", ").split(", ")
    assert [Path(n) for n in named] == [out / a for a in ("baseline", "grown", "wider",
                                                          "wider-eq")]


@pytest.mark.timeout(120)
def test_demo_growth_picks_what_the_grown_arm_grows() -> None:
    runs = {growth: run_demo(seed=1, out=None, patience=3, growth=growth, progress=False)
            for growth in ("neurons", "dendrites")}
    arms = {growth: {a["name"]: a for a in run["arms"]} for growth, run in runs.items()}
    neurons, dendrites = arms["neurons"]["grown"], arms["dendrites"]["grown"]
    assert runs["neurons"]["growth"] == "neurons" and runs["dendrites"]["growth"] == "dendrites"
    assert neurons["dendrites"] == 0 and neurons["neuron_steps"] >= 1
    assert neurons["hidden_width"] == 6 * (1 + neurons["neuron_steps"])
    assert "dendrite set" not in neurons["growth"] and "neuron step" in neurons["growth"]
    assert dendrites["neuron_steps"] == 0 and dendrites["dendrites"] >= 1
    assert dendrites["hidden_width"] == 6 and "neuron step" not in dendrites["growth"]
    # only the grown arm depends on it: the baseline is the same run either way
    assert arms["neurons"]["baseline"]["test_accuracy"] == \
        arms["dendrites"]["baseline"]["test_accuracy"]


@pytest.mark.timeout(120)
def test_demo_set_gives_the_grown_arm_a_setting(capsys: pytest.CaptureFixture) -> None:
    assert main(["demo", "--json", "--out", "", "--seed", "1", "--patience", "3",
                 "--growth", "neurons", "--set", "neurons_per_step=2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["settings"] == {"neurons_per_step": 2}
    arms = {a["name"]: a for a in result["arms"]}
    grown = arms["grown"]
    # each neuron step adds twice the starting width (6 -> 18 -> 30 ...), not once
    assert grown["neuron_steps"] >= 1
    assert grown["hidden_width"] == 6 + 12 * grown["neuron_steps"]
    assert arms["baseline"]["hidden_width"] == 6  # the plain arms take no --set
    assert "grown with: neurons_per_step=2" in format_table(result).splitlines()[-1]


def _usage_error(args: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run the CLI in process on bad arguments: it must exit 2 before any work; its stderr."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    return capsys.readouterr().err


def test_demo_rejects_unknown_option(capsys: pytest.CaptureFixture) -> None:
    assert "--sead" in _usage_error(["demo", "--sead", "1"], capsys)


def test_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_commands = re.findall(r"^    (\S.*)$", readme, flags=re.M)[:2]
    assert first_commands == ['pip install -e ".[demo]" && perfora demo',
                              'pip install -e ".[dev]" && pytest -q']
    # the CPU build's advice comes before the first command
    assert readme.index("download.pytorch.org/whl/cpu") < readme.index(first_commands[0])


def test_readme_loop_is_the_tested_example() -> None:
    example = (ROOT / "examples" / "native_loop.py").read_text()
    for page in (ROOT / "README.md", ROOT / "docs" / "quickstart.md"):  # both show the loop
        text = page.read_text()
        block = re.search(r"```python\n(import torch\n.*?)```", text, flags=re.S).group(1)
        assert block.strip() in example, page


@pytest.mark.timeout(300)
def test_readme_example_runs_and_grows(tmp_path: Path, script_server: ScriptServer) -> None:
    # as `python examples/native_loop.py` runs it, forked from the warm script server
    run = script_server.run(ROOT / "examples" / "native_loop.py", cwd=tmp_path, timeout=240)
    assert run.ok, run.log()
    match = re.search(r"(\d+) dendrite set\(s\), hidden width (\d+), best validation "
                      r"accuracy ([\d.]+)", run.log())
    assert match, run.log()
    assert int(match.group(2)) % 8 == 0 and float(match.group(3)) > 0.5
    # each growth step is announced with its epoch and reason; auto's first is a dendrite set
    assert re.search(r"^epoch \d+: plateau: added dendrite set 1$", run.log(), flags=re.M), \
        run.log()
    assert (tmp_path / "perfora_runs" / "native_loop" / "metrics.csv").is_file()


@pytest.mark.parametrize("option", [["--patience", "0"], ["--hidden", "0"],
                                    ["--max-dendrites", "-1"], ["--seed", "x"],
                                    ["--growth", "width"]])
def test_demo_rejects_out_of_range_values_with_a_usage_error(
        option: list[str], capsys: pytest.CaptureFixture) -> None:
    assert option[0] in _usage_error(["demo", *option], capsys)


@pytest.mark.parametrize(("item", "says"), [
    ("growth=neurons", "the demo has an option for it, --growth"),
    ("n_epochs_to_switch=3", "--patience"),
    ("patience=3", "--patience"),
    ("maximize=false", "reports the validation accuracy"),
    ("max_dendrite_try=2", "did you mean 'max_dendrite_tries'"),
    ("dendrite_optimizer=fresh", "did you mean 'restart'"),
    ("dendrite_optimizer", "use --set NAME=VALUE"),
])
def test_demo_set_refuses_what_it_cannot_use_before_training(
        item: str, says: str, capsys: pytest.CaptureFixture, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --out, perfora_runs/demo, is not made
    assert says in _usage_error(["demo", "--set", item], capsys)
    assert list(tmp_path.iterdir()) == []
