"""The `perfora` command's usage errors and help, as a user meets them: one line saying what
was wrong and exit code 2 (never a traceback), the subcommand's own usage with the closest
option for a mistyped one, and help that says what a subcommand does and its defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfora.cli import build_parser, main
from perfora.config import PerforaConfig
from perfora.errors import ConfigError


def _usage_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("where", ["a_file/sub", "/proc/nonexistent/x"])
def test_demo_out_that_cannot_be_created_is_a_one_line_error(tmp_path, capsys, where):
    (tmp_path / "a_file").write_text("not a folder\n")
    out = where if where.startswith("/") else str(tmp_path / where)
    assert main(["demo", "--out", out, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfora demo: error: --out {out}: cannot create the run folder")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--out ''" in err  # what to do instead


def test_a_mistyped_demo_option_shows_the_demo_usage_and_the_closest_option(capsys):
    err = _usage_error(capsys, ["demo", "--sed", "3"])
    assert err.startswith("usage: perfora demo ")
    assert "perfora demo: error: unrecognized arguments: --sed 3 (did you mean --seed?)" in err
    assert "{demo,launch,convert}" not in err  # not the top-level usage


def test_several_mistyped_options_each_get_their_closest(capsys):
    err = _usage_error(capsys, ["demo", "--sed", "3", "--hiden=4"])
    assert "(did you mean --seed for --sed, --hidden for --hiden?)" in err


def test_a_mistyped_convert_option_names_the_right_one(capsys, tmp_path):
    err = _usage_error(capsys, ["convert", "--wirte", str(tmp_path / "train.py")])
    assert err.startswith("usage: perfora convert ") and "(did you mean --write?)" in err


def test_launch_without_arguments_asks_only_for_what_is_required(capsys):
    err = _usage_error(capsys, ["launch"])
    assert err.startswith("usage: perfora launch ")
    assert err.rstrip().endswith(
        "the following arguments are required: --nproc-per-node/--nproc_per_node, script")
    assert "script_args" not in err


def test_a_syntax_error_is_reported_on_the_line_it_is_on(tmp_path, capsys):
    pytest.importorskip("libcst")
    script = tmp_path / "train.py"
    script.write_text("def broken(:\n    pass\n")
    assert main(["convert", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{script}: not valid Python (line 1): invalid syntax" in err
    script.write_text("import torch\nmodel = torch.nn.Linear(\n")
    assert main(["convert", str(script)]) == 2
    assert "(line 2): '(' was never closed" in capsys.readouterr().err


def test_an_unknown_set_name_gets_the_suggestion_perforaconfig_gives(tmp_path, capsys):
    pytest.importorskip("libcst")
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    with pytest.raises(ConfigError) as config:
        PerforaConfig(nonsense=3)
    suggestion = str(config.value).partition("; ")[2]
    assert suggestion.startswith("did you mean")
    assert main(["convert", "--set", "nonsense=3", str(script)]) == 2
    assert f"--set nonsense: not a native-mode setting; {suggestion}" in capsys.readouterr().err
    assert main(["convert", "--set", "patience=3", str(script)]) == 2  # a name users reach for
    assert "did you mean 'n_epochs_to_switch'?" in capsys.readouterr().err


def _help(*argv: str) -> str:
    parser = build_parser()
    if not argv:
        return parser.format_help()
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            return action.choices[argv[0]].format_help()
    raise AssertionError("no subcommands")


def test_demo_help_says_what_it_does_and_its_defaults():
    text = " ".join(_help("demo").split())
    assert "Train a narrow MLP" in text and "scikit-learn's digits" in text
    assert "plain network widened to the grown size" in text
    # each option's help, from the options list (after the usage line, so later chunks win)
    helps = {chunk.split()[0]: chunk for chunk in text.split(" --")}
    for option, default in [("seed", "0"), ("out", "perfora_runs/demo"), ("hidden", "6"),
                            ("patience", "10"), ("max-dendrites", "3")]:
        assert f"(default {default})" in helps[option], option


@pytest.mark.parametrize("command", [(), ("demo",), ("launch",), ("convert",)])
def test_help_speaks_of_the_perforatedai_recipe_not_of_project_history(command):
    text = " ".join(_help(*command).split())
    assert "the seed's" not in text and "seed way" not in text
    if command == ("launch",):
        assert "the PerforatedAI recipe's initialization run" in text
    if command == ("convert",):
        assert "compat: the PerforatedAI recipe" in text


def test_a_run_folder_that_exists_is_used(tmp_path: Path, monkeypatch, capsys):
    """The check creates the folder or accepts an existing one; it refuses nothing else."""
    import perfora.cli.demo as demo

    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda **kw: calls.append(kw) or {"arms": []})
    monkeypatch.setattr(demo, "format_table", lambda result: "table")
    assert main(["demo", "--out", str(tmp_path), "--no-progress"]) == 0
    assert main(["demo", "--out", str(tmp_path / "new" / "runs"), "--no-progress"]) == 0
    assert (tmp_path / "new" / "runs").is_dir() and len(calls) == 2
    assert main(["demo", "--out", "", "--no-progress", "--growth", "neurons"]) == 0
    assert [c["growth"] for c in calls] == ["auto", "auto", "neurons"]  # auto: the default
    capsys.readouterr()


def test_the_progress_bar_shows_only_on_a_terminal(monkeypatch, capsys):
    """Redirected to a file, the bar's redraws would fill it with thousands of lines."""
    import io

    import perfora.cli.demo as demo

    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda **kw: calls.append(kw) or {"arms": []})
    monkeypatch.setattr(demo, "format_table", lambda result: "table")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stderr in (io.StringIO(), Terminal()):
        monkeypatch.setattr("sys.stderr", stderr)
        assert main(["demo", "--out", ""]) == 0
    monkeypatch.setattr("sys.stderr", Terminal())
    assert main(["demo", "--out", "", "--no-progress"]) == 0
    assert [c["progress"] for c in calls] == [False, True, False]
    capsys.readouterr()


def test_version_names_perfora_torch_and_python(capsys):
    import sys

    import torch

    import perfora

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    line = capsys.readouterr().out.strip()
    python = ".".join(map(str, sys.version_info[:3]))
    assert line == f"perfora {perfora.__version__} (torch {torch.__version__}, Python {python})"


def test_the_demo_table_says_how_the_grown_arm_grew():
    from perfora.cli.demo import format_table

    def arm(name: str, growth: str = "") -> dict:
        return {"name": name, "params": 900, "hidden_width": 12, "dendrites": 1,
                "test_accuracy": 0.95, "val_accuracy": 0.96, "epochs": 80, "seconds": 1.0,
                "growth": growth}

    grew = "2 dendrite sets, then 1 neuron step; 1 step undone (it did not beat the best score)"
    result = {"wider_hidden": 12, "arms": [arm("baseline"), arm("grown", grew), arm("wider"),
                                           arm("wider-eq")]}
    assert format_table(result).splitlines()[-1] == f"how grown grew: {grew}"


def test_set_maximize_points_to_its_own_options_and_never_writes_it_twice(tmp_path, capsys):
    pytest.importorskip("libcst")
    from perfora.codemod import convert_source

    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    assert main(["convert", "--set", "maximize=True", str(script)]) == 2
    assert "--maximize (a higher score is better) and --minimize" in capsys.readouterr().err
    source = (
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "for epoch in range(3):\n"
        "    for x in [torch.randn(4, 2)]:\n"
        "        optimizer.zero_grad()\n"
        "        model(x).sum().backward()\n"
        "        optimizer.step()\n"
        "    val_loss = 1.0\n"
    )
    result = convert_source(source, "native", settings={"maximize": "False"}, name="train")
    assert result.output.count("maximize=") == 1 and "maximize=False" in result.output
    compile(result.output, "train.py", "exec")  # used to be a repeated keyword: a SyntaxError
