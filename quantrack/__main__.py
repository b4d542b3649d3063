"""`python -m quantrack` = the `quantrack` console script (which does ``sys.exit(main())``)."""

from quantrack.cli import main

raise SystemExit(main())
