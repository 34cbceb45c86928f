"""The self-contained launcher (``verl-launcher.pyz``) the operator image carries for Ray pods to copy.

One function writes it, for the image built from the ``Dockerfile`` and for the one built without a container
engine (``verl-operator-dev devcluster image``): the same sources give the same bytes.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import verl_contract


def launcher_zipapp(launcher_package: Path) -> bytes:
    """A self-contained ``verl-launcher`` zipapp: the package's sources, the contract's and a ``__main__``.

    It needs only a Python 3.10+ with ``ray`` and ``pydantic`` 2 (both in a verl image). Entries are written
    in sorted order with a fixed timestamp, so the bytes depend on the sources only.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        main = "import sys\n\nfrom verl_launcher.cli import main\n\nsys.exit(main())\n"
        archive.writestr(zipfile.ZipInfo("__main__.py", date_time=(1980, 1, 1, 0, 0, 0)), main)
        # The launcher imports the launch contract (``verl_contract``), which the verl image does not have.
        for package, top in (
            (launcher_package, "verl_launcher"),
            (Path(verl_contract.__file__).parent, "verl_contract"),
        ):
            for path in sorted(package.rglob("*.py")):
                name = f"{top}/{path.relative_to(package).as_posix()}"
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
    buffer.seek(0)
    return b"#!/usr/bin/env python3\n" + buffer.read()
