"""`python -I -m rdmad.guard ...`: what the modprobe.d hook and the openibd drop-in run."""

import sys

from rdmad.guard.cli import main

sys.exit(main())
