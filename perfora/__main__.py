"""``python -m perfora``: the same as the ``perfora`` command."""

from .cli import main

raise SystemExit(main())
