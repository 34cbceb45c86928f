"""``python -m verl_launcher``."""

from __future__ import annotations

import sys

from verl_launcher.cli import main

sys.exit(main())
