"""Deprecated path: moved to :mod:`perfora.codemod.native_edits`.

The old path works for one more release, with a DeprecationWarning."""

from perfora._moved import alias_moved_module

alias_moved_module(__name__, "perfora.codemod.native_edits")
