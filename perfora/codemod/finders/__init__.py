"""Finders: each reads one part of a training script and returns what it found.

``tree`` (with ``collect``) parses the script once and answers where a node is and which
calls it holds; ``imports``, ``arguments`` (argparse), ``optimizer`` (with ``calls``,
``helper`` and ``scheduler``), ``wrap`` (DataParallel/DDP), ``placement`` (where perfora's
block goes), ``loop`` (the epoch loop), ``steps`` (its scheduler steps), ``score`` and
``batch`` each return a small frozen result with their findings;
:func:`perfora.codemod.analysis.find_parts` composes them.
"""
