"""``python -m netopt``."""

from netopt.cli.main import run

run()
