"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Shared helpers (tests/support: paths, torchrun jobs, the codemod runner) import by name.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

# Run files are fsynced by default (a checkpoint survives a power loss). The suite writes
# thousands of small files, and an fsync costs ~10 ms each, so it turns that off unless the
# environment asks for it (PERFORA_FSYNC=1); tests/unit/checkpoint/test_hostile_files.py
# checks the fsyncs.
os.environ.setdefault("PERFORA_FSYNC", "0")
