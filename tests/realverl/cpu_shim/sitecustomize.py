"""Interpreter start-up hook of the real-verl tier: installs the CPU shim when ``VERL_CPU_SHIM=1``.

Python imports ``sitecustomize`` at start-up from ``sys.path``; this folder is on ``PYTHONPATH`` only in
the real-verl tier's processes (the launcher, its ``ray start``, Ray's workers and verl's driver all inherit
it). Without the variable this file does nothing. What the shim changes and why: ``verl_cpu_shim.py`` and
docs/realverl.md.
"""

import os

if os.environ.get("VERL_CPU_SHIM") == "1":
    import verl_cpu_shim

    verl_cpu_shim.install()
