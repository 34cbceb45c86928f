"""Launcher injection: Ray pods of an unmodified verl image get ``verl-launcher`` from the operator's image.

An init container of the operator's image copies the self-contained launcher (a zipapp) into an emptyDir;
the Ray container runs it with the image's own ``python3``. Regenerate the snapshot after an intended change
with ``VERL_OPERATOR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_manifests_launcher_injection.py``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from test_manifests_children import JOB, PLAN, check_snapshot, make_spec

from verl_launcher.verl import build_env, launcher_archive
from verl_operator.launcher_zipapp import launcher_zipapp
from verl_operator.manifests import build_children, build_head_pod, build_launch_spec, build_worker_pod
from verl_operator.manifests.launchspec import LAUNCHER_IN_OPERATOR_IMAGE, LAUNCHER_PYZ

OPERATOR_IMAGE = "ghcr.io/verl-operator/verl-operator:0.1.0"
INJECTING = dataclasses.replace(PLAN, launcher_image=OPERATOR_IMAGE)
LAUNCHER_SOURCES = Path(__file__).resolve().parents[2] / "launcher" / "verl_launcher"
LAUNCH_SPEC = build_launch_spec(JOB, make_spec(), PLAN)


def ray_container(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def test_injected_children_snapshot() -> None:
    check_snapshot("children-dgx-2x8-injected", build_children(JOB, make_spec(), INJECTING, attempt=0))


@pytest.mark.parametrize(
    ("launcher", "image", "injected"),
    [
        pytest.param("inject", OPERATOR_IMAGE, True, id="inject-with-operator-image"),
        pytest.param("image", OPERATOR_IMAGE, False, id="image-has-its-own-launcher"),
        pytest.param("inject", None, False, id="operator-without-an-image-runs-the-images-launcher"),
        pytest.param("image", None, False, id="image-without-operator-image"),
    ],
)
@pytest.mark.parametrize("index", [0, 1], ids=["head", "worker"])
def test_injection_is_decided_by_the_spec_and_the_operator_image(
    launcher: str, image: str | None, injected: bool, index: int
) -> None:
    spec = make_spec(verl={"launcher": launcher})
    plan = dataclasses.replace(PLAN, launcher_image=image)
    pod = build_head_pod(JOB, spec, plan, 0) if index == 0 else build_worker_pod(JOB, spec, plan, index, 0)
    role = "head" if index == 0 else "worker"
    container = ray_container(pod)
    if injected:
        assert container["command"] == ["python3", LAUNCHER_PYZ, role]
        [init] = pod["spec"]["initContainers"]
        assert init["image"] == OPERATOR_IMAGE
        assert init["command"] == ["cp", LAUNCHER_IN_OPERATOR_IMAGE, LAUNCHER_PYZ]
    else:
        assert container["command"] == ["verl-launcher", role]
        assert "initContainers" not in pod["spec"]
        assert "verl-launcher" not in {v["name"] for v in pod["spec"]["volumes"]}
    # The job's own image runs Ray either way.
    assert container["image"] == spec.verl.image


def test_the_copy_lands_where_the_ray_container_runs_it() -> None:
    pod = build_head_pod(JOB, make_spec(), INJECTING, 0)
    [init] = pod["spec"]["initContainers"]
    target_dir = str(Path(LAUNCHER_PYZ).parent)
    [init_mount] = [m for m in init["volumeMounts"] if m["mountPath"] == target_dir]
    [ray_mount] = [m for m in ray_container(pod)["volumeMounts"] if m["mountPath"] == target_dir]
    assert init_mount["name"] == ray_mount["name"]
    assert ray_mount["readOnly"] is True
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == ray_mount["name"]]
    assert "emptyDir" in volume


def test_the_zipapp_holds_only_the_launcher_and_the_contract_and_is_reproducible() -> None:
    first, second = launcher_zipapp(LAUNCHER_SOURCES), launcher_zipapp(LAUNCHER_SOURCES)
    assert first == second
    assert first.startswith(b"#!/usr/bin/env python3\n")


def test_the_zipapp_runs_with_a_plain_python(tmp_path: Path) -> None:
    """``python3 verl-launcher.pyz``: the zip's own launcher package is what runs (isolated mode, no cwd)."""
    pyz = tmp_path / "verl-launcher.pyz"
    pyz.write_bytes(launcher_zipapp(LAUNCHER_SOURCES))
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
    assert "__main__.py" in names
    assert all(n == "__main__.py" or n.startswith(("verl_launcher/", "verl_contract/")) for n in names)
    assert {"verl_launcher/cli.py", "verl_contract/launch_spec.py", "verl_contract/gpu_product.py"} <= set(
        names
    )
    done = subprocess.run(
        [sys.executable, "-I", str(pyz), "head", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "start the Ray head" in done.stdout or "--progress-file" in done.stdout
    where = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import verl_launcher.cli, verl_contract; "
            "print(verl_launcher.__file__); print(verl_contract.__file__)",
            str(pyz),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    files = where.stdout.split()
    assert len(files) == 2 and all(f.startswith(str(pyz)) for f in files), where.stdout + where.stderr


@pytest.mark.parametrize(
    ("module_file", "archive"),
    [
        pytest.param(
            "/opt/verl-launcher/verl-launcher.pyz/verl_launcher/verl.py",
            "/opt/verl-launcher/verl-launcher.pyz",
            id="zipapp",
        ),
        pytest.param("/usr/lib/python3/site-packages/verl_launcher/verl.py", None, id="installed"),
    ],
)
def test_the_launcher_knows_its_archive(module_file: str, archive: str | None) -> None:
    assert launcher_archive(module_file) == archive


def test_ray_processes_started_from_the_zipapp_can_import_the_launcher(tmp_path: Path) -> None:
    """Ray's workers run the launcher's probe task: the env of `ray start` puts the archive on PYTHONPATH."""
    pyz = tmp_path / "verl-launcher.pyz"
    pyz.write_bytes(launcher_zipapp(LAUNCHER_SOURCES))
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); "
        "from verl_launcher.verl import launcher_archive; print(json.dumps(launcher_archive()))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(pyz)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == str(pyz)
    env = build_env(LAUNCH_SPEC, {"PYTHONPATH": "/extra"})
    assert env["PYTHONPATH"] == "/extra", "an installed launcher leaves PYTHONPATH alone"
