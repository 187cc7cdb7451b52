"""The memory benchmarks' allocator settings reach the processes they start and nothing else:
``rss.malloc_env`` sets them for its block only, so a later child of the same process (another
test on the same pytest worker) starts with the environment it had."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from rss import MALLOC_ENV, malloc_env  # noqa: E402


def test_the_malloc_settings_hold_inside_the_block_and_are_restored_after(monkeypatch):
    key, other = list(MALLOC_ENV)
    monkeypatch.setenv(key, "123")  # a value of the caller's own comes back
    monkeypatch.delenv(other, raising=False)  # an absent one is absent again
    with malloc_env():
        assert {k: os.environ[k] for k in MALLOC_ENV} == MALLOC_ENV
    assert os.environ[key] == "123" and other not in os.environ


def test_the_settings_are_restored_when_the_block_fails(monkeypatch):
    for key in MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError), malloc_env():
        raise RuntimeError("a rank failed to start")
    assert not any(key in os.environ for key in MALLOC_ENV)
