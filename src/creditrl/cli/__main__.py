"""``python -m creditrl.cli ...`` (as ``torchrun`` launches it): the ``creditrl`` command."""

import sys

from creditrl.cli import main

sys.exit(main())
