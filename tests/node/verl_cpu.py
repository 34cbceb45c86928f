"""verl 0.6.1's real trainer in the Ray pods of real nodes, on CPU: what a VerlJob needs to run it.

The pods run the node tier's test image (Debian, Ray, the stand-in ``nvidia-smi``) with the launcher injected
as for any verl image. verl, torch and their requirements are not copied into an image: the real-verl tier's
cached environment (``tests/realverl/cpu_env.py``, 7.4 GB with PyPI's CUDA torch) is mounted read-only from
the host at the same path, with the interpreter it was created from (a venv's ``python`` is a link to its
base interpreter, whose standard library and ``libpython`` the venv needs), the test assets and the CPU shim.
The pods' ``PATH`` puts the environment first, so the injected launcher, its ``ray start`` and verl's
``python3 -m verl.trainer.main_ppo`` all run one interpreter and one Ray, as in a verl image.

hostPath volumes are denied by the admission policy's defaults; the node tier's administrator allows them
(``conftest.ALLOWED_VOLUME_TYPES``), as a test cluster's administrator may.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from realverl import cpu_env
from realverl.realverl_job import GPU_PRODUCT, SHIM_DIR, job_spec
from verl_devtools.devcluster.nodeconfig import REAL_NODE_LABEL, REAL_NODE_TAINT

#: The image's PATH after the environment's ``bin`` (conftest.python_ray_recipe's, without its venv).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Base interpreters that cannot be mounted over the image's own folders.
SYSTEM_PREFIXES = frozenset({"/", "/usr", "/usr/local"})


@dataclass(frozen=True)
class HostVerl:
    """The host folders the pods mount read-only, each at its own path."""

    env: Path  # the real-verl virtualenv
    base: Path  # the interpreter it was created from (sys.base_prefix)
    assets: Path  # the tiny model, tokenizer, data and reward
    shim: Path  # tests/realverl/cpu_shim

    @classmethod
    def ensure(cls) -> HostVerl:
        """Build (or find) the real-verl environment and the assets; find the environment's base interpreter.

        Raises:
            RuntimeError: the base interpreter is a system folder (mounting it would hide the image's own).
        """
        python = cpu_env.ensure()
        assets = cpu_env.ensure_assets(python)
        base = subprocess.run(
            [str(python), "-c", "import sys; print(sys.base_prefix)"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        if base in SYSTEM_PREFIXES:
            raise RuntimeError(
                f"the real-verl environment's base interpreter lives in {base}: mounting it would hide the "
                "image's own files; create the environment from an interpreter installed elsewhere (pyenv)"
            )
        return cls(env=cpu_env.env_root(), base=Path(base), assets=assets, shim=SHIM_DIR)

    def folders(self) -> dict[str, Path]:
        return {
            "verl-env": self.env,
            "verl-python": self.base,
            "verl-assets": self.assets,
            "verl-shim": self.shim,
        }

    def volumes(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "hostPath": {"path": str(path), "type": "Directory"}}
            for name, path in self.folders().items()
        ]

    def volume_mounts(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "mountPath": str(path), "readOnly": True} for name, path in self.folders().items()
        ]

    def env_vars(self) -> list[dict[str, str]]:
        """The pods' environment: the real-verl interpreter first on PATH, the CPU shim on, one stand-in GPU."""
        values = {
            "PATH": f"{self.env / 'bin'}:{SYSTEM_PATH}",
            "PYTHONPATH": str(self.shim),
            "VERL_CPU_SHIM": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # the environment is mounted read-only
            "STANDIN_GPU_COUNT": "1",  # the stand-in nvidia-smi lists the pod's one GPU
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        return [{"name": name, "value": value} for name, value in values.items()]


def verl_cpu_job(
    name: str,
    image: str,
    host: HostVerl,
    *,
    algorithm: str = "grpo",
    train_file: Path | None = None,
    steps: int = 2,
) -> dict[str, Any]:
    """The real-verl tier's tiny job (``realverl_job.job_spec``) as a VerlJob for the real nodes: 2 pods of 1
    stand-in GPU each, the host's verl environment mounted, progress read every 5 s."""
    spec = job_spec(host.assets, algorithm, train_file=train_file, steps=steps)
    spec["verl"] = {"image": image, "version": "0.6", "imagePullPolicy": "Never"}
    spec["resources"] = {
        **spec["resources"],
        "gpuProduct": GPU_PRODUCT,
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists"}],
        # Requests sized for a 2-core machine: Ray sees the node's CPUs (no CPU limit) either way.
        "cpuPerNode": "200m",
        "memoryPerNode": "2Gi",
        "shmSize": "512Mi",
    }
    spec["env"] = host.env_vars()
    spec["volumes"] = host.volumes()
    spec["volumeMounts"] = host.volume_mounts()
    spec["backoffLimit"] = 0
    spec["monitoring"] = {"statusIntervalSeconds": 5}
    return {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": name},
        "spec": spec,
    }
