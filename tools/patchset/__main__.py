"""``python -m patchset``."""

from patchset.cli import main

raise SystemExit(main())
