from __future__ import annotations

import sys

from verl_operator.cli import main

sys.exit(main())
