"""Deprecated path: the shell's errors live in :mod:`perfora.errors` (works for one more
release, with a warning)."""

from perfora._moved import alias_moved_module

alias_moved_module(__name__, "perfora.errors")
