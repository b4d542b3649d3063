"""`python -m quantrack` = the `quantrack` console script."""

from quantrack.cli import main

main()
