"""``--set NAME=VALUE`` reads the value a user means (JSON where it parses, text otherwise),
for the quality benchmark's custom arm and the held-out check's variant alike."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest

from tests.support.paths import ROOT


def _settings_arg():
    spec = importlib.util.spec_from_file_location("settings_arg",
                                                  ROOT / "benchmarks" / "settings_arg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(*argv: str) -> dict:
    module = _settings_arg()
    parser = argparse.ArgumentParser()
    module.add_set_argument(parser, help="overrides")
    return module.parse_settings(parser, parser.parse_args(list(argv)).set)


def test_values_are_json_where_they_parse_and_text_otherwise() -> None:
    assert _parse("--set", "grow_fraction=0.5", "--set", "max_dendrites=8",
                  "--set", "neuron_init=random", "--set", 'growth="auto"',
                  "--set", "retain_all_dendrites=false") == {
        "grow_fraction": 0.5, "max_dendrites": 8, "neuron_init": "random", "growth": "auto",
        "retain_all_dendrites": False}
    assert _parse() == {}


@pytest.mark.parametrize("item", ["grow_fraction", "=0.5"])
def test_an_item_without_name_and_value_is_a_usage_error(item: str, capsys) -> None:
    with pytest.raises(SystemExit):
        _parse("--set", item)
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_a_held_out_run_takes_the_overrides() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("heldout_for_test",
                                                      ROOT / "benchmarks" / "heldout.py")
        heldout = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(heldout)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    data = heldout.split(*heldout._datasets()["iris"](0), 0)
    grown = heldout.train(data, heldout.HIDDEN, 0, max_dendrites=0, max_neuron_steps=0)
    assert (grown["dendrites"], grown["neurons"]) == (0, 0)
    assert grown["params"] == 4 * 8 + 8 + 8 * 3 + 3  # the start MLP, nothing grown
