"""``python -m netopt``."""

import sys

from netopt.cli.main import main

sys.exit(main())
