"""`python -m quantrack.cli` = the `quantrack` console script."""

from quantrack.cli import main

raise SystemExit(main())
