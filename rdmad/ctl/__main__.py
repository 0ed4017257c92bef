"""``python -m rdmad.ctl``: what the installed rdmad-ctl wrapper runs."""

import sys

from rdmad.ctl import main

sys.exit(main())
