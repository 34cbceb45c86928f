from __future__ import annotations

import sys

from verl_devtools.cli import main

sys.exit(main())
