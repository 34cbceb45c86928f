"""Deterministic names and labels of a VerlJob's children (a restart never invents new names).

A VerlJob's name is a DNS subdomain of at most ``MAX_JOB_NAME`` characters (the API server and the CRD's CEL
rule check it): it may start with a digit and contain dots. Every child name is valid for its kind:

- ConfigMap, ServiceAccount, pods, PodGroup (DNS subdomains): ``<job>-launch``, ``<job>-ray``,
  ``<job>-r<attempt>-head``, ...: valid for any job name.
- The Service (a DNS-1035 label: a letter first, no dots) and the pods' hostnames (DNS-1123 labels) use the
  :attr:`ChildNames.stem`: the job's name when it is a DNS-1035 label, else ``vj-`` + the name with dots as
  dashes + ``-`` + six hex digits of its SHA-256 (two names that read alike still get different stems).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

LABEL_JOB = "verl-operator.io/job"
LABEL_ROLE = "verl-operator.io/role"
LABEL_ATTEMPT = "verl-operator.io/attempt"
LABEL_INDEX = "verl-operator.io/node-index"
#: The plan's rollout engine (``vllm``, ``sglang``, ``trtllm``) on every Ray pod.
LABEL_ENGINE = "verl-operator.io/rollout-engine"
#: The trainer mode's pool(s) whose GPUs the pod holds (``trainer``, ``rollout``, or ``both``: a one-pool mode,
#: or both pools on every node); absent on pods of plans without pools.
LABEL_POOL = "verl-operator.io/pool"
ANNOTATION_NODE = "verl-operator.io/node"
GANG_GATE = "verl-operator.io/gang"
MANAGED_BY = {"app.kubernetes.io/managed-by": "verl-operator", "app.kubernetes.io/name": "verl"}

#: A job name must leave room for the longest child name (``<job>-r<attempt>-worker-<i>``, pod hostnames
#: and Service names are DNS labels of at most 63 characters).
MAX_JOB_NAME = 40
#: A DNS-1035 label (RFC 1035): what a Service name must be.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: A DNS-1123 label: what a hostname must be.
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A DNS-1123 subdomain: what the names of the other kinds must be.
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: The prefix of a stem derived from a name that is not a DNS-1035 label.
STEM_PREFIX = "vj-"
#: Hex digits of the name's hash in a derived stem.
STEM_HASH = 6


def dns_stem(job: str) -> str:
    """The job's name where a DNS-1035 label is needed (see the module docstring); at most ``MAX_JOB_NAME``
    characters for a job name of at most that many."""
    if DNS_1035_LABEL.match(job) and len(job) <= MAX_JOB_NAME:
        return job
    digest = hashlib.sha256(job.encode()).hexdigest()[:STEM_HASH]
    body = re.sub(r"[^a-z0-9-]", "-", job.lower())[: MAX_JOB_NAME - len(STEM_PREFIX) - STEM_HASH - 1]
    return f"{STEM_PREFIX}{body}-{digest}"


@dataclass(frozen=True)
class ChildNames:
    """The names of every child of job ``job`` (in namespace ``namespace``)."""

    job: str
    namespace: str

    @property
    def stem(self) -> str:
        """The job's name in DNS-label positions (:func:`dns_stem`)."""
        return dns_stem(self.job)

    @property
    def configmap(self) -> str:
        """``<job>-launch``: holds ``launch.json``."""
        return f"{self.job}-launch"

    @property
    def service(self) -> str:
        """``<stem>-ray``: the headless Service giving each Ray pod a DNS name (a DNS-1035 label)."""
        return f"{self.stem}-ray"

    @property
    def service_account(self) -> str:
        """``<job>-ray``: the Ray pods' ServiceAccount (kinds do not share names)."""
        return f"{self.job}-ray"

    @property
    def head_hostname(self) -> str:
        """``<stem>-head-0``: the head pod's hostname (stable across restarts)."""
        return f"{self.stem}-head-0"

    @property
    def head_host(self) -> str:
        """The head's DNS name, ``<stem>-head-0.<stem>-ray.<namespace>.svc``."""
        return f"{self.head_hostname}.{self.service}.{self.namespace}.svc"

    def pod(self, attempt: int, index: int) -> str:
        """Pod name of node ``index`` (0 = head) in Ray cluster ``attempt``: ``<job>-r<attempt>-head|worker-<i>``."""
        return f"{self.job}-r{attempt}-head" if index == 0 else f"{self.job}-r{attempt}-worker-{index}"

    def hostname(self, index: int) -> str:
        """Hostname of node ``index``: ``<stem>-head-0`` or ``<stem>-worker-<i>``."""
        return self.head_hostname if index == 0 else f"{self.stem}-worker-{index}"
