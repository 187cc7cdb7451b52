"""The same-GEMM reference of ``benchmarks/overhead.py --floor`` is a fair floor.

Its ratio over the FLOP ideal is read as "what the extra GEMMs alone cost", so it must count
exactly the matmul/conv FLOPs of the perforated model with the same K, compute the plain
model's function scaled by K + 1 (each layer's copies are summed), and keep the plain model
untouched.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support.paths import ROOT


def load_overhead():
    spec = importlib.util.spec_from_file_location(
        "overhead_benchmark", ROOT / "benchmarks" / "overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model_name", ["mlp 64-256-256-10", "cnn 28x28 c16-c32-c32"])
@pytest.mark.parametrize("k", [1, 3])
def test_same_gemm_model_counts_the_flops_of_k_dendrites(model_name, k):
    overhead = load_overhead()
    build, in_shape = overhead.MODELS[model_name]
    torch.manual_seed(0)
    plain = build()
    x = torch.randn(4, *in_shape)
    y = torch.randint(0, 10, (4,))
    before = {name: t.clone() for name, t in plain.state_dict().items()}
    floor = overhead.same_gemms(plain, k)
    perforated = overhead.converted(plain, k, seed=k)
    assert overhead.step_flops(floor, x, y) == overhead.step_flops(perforated, x, y)
    assert overhead.step_flops(floor, x, y) == (k + 1) * overhead.step_flops(plain, x, y)
    wrapped = [m for m in floor.modules() if isinstance(m, overhead.SameGemms)]
    assert len(wrapped) == sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
                               for m in plain.modules())
    assert all(len(m.copies) == k + 1 for m in wrapped)
    # the plain model is left as it was
    assert all(torch.equal(before[name], t) for name, t in plain.state_dict().items())
    assert not any(isinstance(m, overhead.SameGemms) for m in plain.modules())


@pytest.mark.parametrize("other", ["--compile", "--unfused"])
def test_floor_refuses_the_modes_it_does_not_measure(other, tmp_path, capsys):
    """--floor with --compile or --unfused would write floor rows into another mode's
    results file; it is refused before any timing, saying why."""
    overhead = load_overhead()
    with pytest.raises(SystemExit) as exit_info:
        overhead.main(["--floor", other, "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "run it without --compile and --unfused" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
