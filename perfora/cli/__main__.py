"""``python -m perfora.cli``: the same as the ``perfora`` command (and ``python -m perfora``)."""

from . import main

raise SystemExit(main())
