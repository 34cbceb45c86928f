"""Deterministic names and labels of a VerlJob's children (a restart never invents new names)."""

from __future__ import annotations

from dataclasses import dataclass

LABEL_JOB = "verl-operator.io/job"
LABEL_ROLE = "verl-operator.io/role"
LABEL_ATTEMPT = "verl-operator.io/attempt"
LABEL_INDEX = "verl-operator.io/node-index"
ANNOTATION_NODE = "verl-operator.io/node"
GANG_GATE = "verl-operator.io/gang"
MANAGED_BY = {"app.kubernetes.io/managed-by": "verl-operator", "app.kubernetes.io/name": "verl"}

#: A job name must leave room for the longest child name (``<job>-r<attempt>-worker-<i>``, pod hostnames
#: and Service names are DNS labels of at most 63 characters).
MAX_JOB_NAME = 40


@dataclass(frozen=True)
class ChildNames:
    """The names of every child of job ``job`` (in namespace ``namespace``)."""

    job: str
    namespace: str

    @property
    def configmap(self) -> str:
        """``<job>-launch``: holds ``launch.json``."""
        return f"{self.job}-launch"

    @property
    def service(self) -> str:
        """``<job>-ray``: the headless Service giving each Ray pod a DNS name."""
        return f"{self.job}-ray"

    @property
    def service_account(self) -> str:
        """The Ray pods' ServiceAccount (same name as the Service; kinds do not share names)."""
        return f"{self.job}-ray"

    @property
    def head_hostname(self) -> str:
        """``<job>-head-0``: the head pod's hostname (stable across restarts)."""
        return f"{self.job}-head-0"

    @property
    def head_host(self) -> str:
        """The head's DNS name, ``<job>-head-0.<job>-ray.<namespace>.svc``."""
        return f"{self.head_hostname}.{self.service}.{self.namespace}.svc"

    def pod(self, attempt: int, index: int) -> str:
        """Pod name of node ``index`` (0 = head) in Ray cluster ``attempt``: ``<job>-r<attempt>-head|worker-<i>``."""
        return f"{self.job}-r{attempt}-head" if index == 0 else f"{self.job}-r{attempt}-worker-{index}"

    def hostname(self, index: int) -> str:
        """Hostname of node ``index``: ``<job>-head-0`` or ``<job>-worker-<i>``."""
        return self.head_hostname if index == 0 else f"{self.job}-worker-{index}"
