"""Modules moved in the 0.2 layout: the old import paths still work, warn, and give the very
same objects; the split error classes are still caught as ConversionError."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import perfora

MOVED = {
    "perfora.convert": "perfora.perforation",
    "perfora.codemod.cli": "perfora.cli.convert",
    "perfora.distributed.launch": "perfora.cli.launch",
    "perfora.compat.conversion": "perfora.compat.module_selection",
    "perfora.compat.wrappers": "perfora.compat.rewrap",
    "perfora.compat.errors": "perfora.errors",
    "perfora.codemod.compat": "perfora.codemod.compat_edits",
    "perfora.codemod.native": "perfora.codemod.native_edits",
    "perfora.controller": "perfora.growth.controller",
    "perfora.distributed.collectives": "perfora.parallel.collectives",
    "perfora.distributed.fingerprint": "perfora.parallel.fingerprint",
    "perfora.distributed.helpers": "perfora.parallel.helpers",
    "perfora.distributed.wrappers": "perfora.parallel.wrappers",
    "perfora.distributed.fsdp": "perfora.parallel.fsdp",
}


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_old_import_path_warns_and_gives_the_new_module(old, new):
    pytest.importorskip("libcst")
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_from_import_of_an_old_path_gives_the_same_function():
    sys.modules.pop("perfora.convert", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from perfora.convert import perforate
    assert perforate is perfora.perforate
    assert callable(perfora.perforate)  # the package attribute stays the function


def test_new_paths_import_without_a_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in ("perfora.perforation", "perfora.cli", "perfora.cli.launch", "perfora.restart",
                     "perfora.compat.module_selection", "perfora.compat.rewrap"):
            importlib.reload(importlib.import_module(name))


@pytest.mark.parametrize("error", [perfora.PerforationError, perfora.ParallelError,
                                   perfora.ExportError])
def test_split_errors_are_still_conversion_errors(error):
    assert issubclass(error, perfora.ConversionError)
    with pytest.raises(perfora.ConversionError):
        raise error("x")


def test_wrapping_a_model_without_layers_raises_perforation_error():
    from torch import nn

    with pytest.raises(perfora.PerforationError, match="nothing to perforate"):
        perfora.perforate(nn.Sequential(nn.ReLU()))


def test_sharding_outside_perfora_raises_parallel_error():
    from torch import nn

    with pytest.raises(perfora.ParallelError, match="perforated model"):
        perfora.shard_fsdp2(nn.Sequential(nn.Linear(2, 2)))


def test_restart_contract_is_public():
    from perfora.cli.launch import mark_training_complete

    assert perfora.mark_training_complete is mark_training_complete


def test_perfora_resume_stays_the_function_after_importing_every_submodule(tmp_path,
                                                                           script_server):
    import textwrap

    # in a process of its own: some submodules (the compat shell) change global settings
    script = tmp_path / "import_all.py"
    script.write_text(textwrap.dedent("""
        import importlib, pkgutil, sys, warnings
        import perfora
        import perfora.resume
        warnings.simplefilter("ignore")
        for info in pkgutil.walk_packages(perfora.__path__, "perfora."):
            if info.name.endswith("__main__"):  # runs the CLI
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional dependency (lightning, libcst...) is missing
                continue
        assert callable(perfora.resume), perfora.resume
        assert perfora.resume is sys.modules["perfora.resume"].resume
        assert perfora.resume.__name__ == "resume"
        print("ok")
    """))
    done = script_server.run(script, cwd=tmp_path, timeout=300)
    assert done.ok and done.log().strip().endswith("ok"), done.log()[-2000:]


def test_moved_checkpoint_names_are_the_surgery_functions():
    from perfora import checkpoint
    from perfora.growth import surgery

    assert checkpoint.fit_structure is surgery.fit_structure
    assert checkpoint.save_model is surgery.save_model is perfora.save_model
    assert checkpoint.load_model is surgery.load_model is perfora.load_model
    with pytest.raises(AttributeError):
        checkpoint.no_such_name  # noqa: B018
