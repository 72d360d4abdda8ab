"""`python -m ironserve`: the console script."""

import sys

from .console import run

sys.exit(run())
