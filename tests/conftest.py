"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Shared helpers live in the package tests.support (paths, torchrun jobs, the script server);
# the repository root on the path makes it importable however pytest is started.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Run files are fsynced by default (a checkpoint survives a power loss). The suite writes
# thousands of small files, and an fsync costs ~10 ms each, so it turns that off unless the
# environment asks for it (PERFORA_FSYNC=1); tests/unit/checkpoint/test_hostile_files.py
# checks the fsyncs.
os.environ.setdefault("PERFORA_FSYNC", "0")

# One intra-op thread per process, inherited by every rank the tests start: two pytest-xdist
# workers, each starting 2-rank jobs, on CI's 2 cores. With torch's default (one thread per
# core) the processes' OpenMP pools oversubscribe the cores and spin against each other,
# which made the suite several times slower than its work.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread settings, which torch reads at import)

torch.set_num_threads(1)

from tests.support.script_server import ScriptServer  # noqa: E402

# The imports training scripts need, done once in a warm server per pytest worker that forks
# each script's ranks (tests/support/script_server.py); optional packages that are missing
# are left out, and their tests skip.
SERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.fsdp",
                  "torch.distributed.checkpoint", "perfora", "perfora.compat",
                  "perfora.integrations.lightning", "lightning.pytorch", "lightning.fabric",
                  "sklearn.datasets", "matplotlib.pyplot", "transformers", "accelerate",
                  "perfora.integrations.transformers", "perfora.integrations.accelerate",
                  "perfora.integrations.fabric"]


@pytest.fixture(scope="session")
def script_server() -> Iterator[ScriptServer]:
    """Runs scripts as ``python script.py`` or torchrun would, without their import cost."""
    with ScriptServer(SERVER_PRELOAD) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first (marked slow, then the integration tests, then the unit tests;
    each kind in collection order): pytest-xdist hands tests out in this order, so the long
    ones start while both workers are free instead of ending the run on one of them."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if "integration" in Path(str(item.fspath)).parts else 2

    items.sort(key=rank)
