"""Label the node with what the probe saw, through the Kubernetes API with the pod's service account.

Only the standard library is used (urllib + ssl): a JSON merge patch of the Node's labels.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_launcher.probe import NodeProbe

#: The label the planner reads: the smallest NVLink domain of the node's GPUs ("1" = no NVLink).
NVLINK_DOMAIN_LABEL = "verl-operator.io/nvlink-domain-size"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def node_labels(probe: NodeProbe) -> dict[str, str]:
    """The labels this probe sets on its node."""
    return {NVLINK_DOMAIN_LABEL: str(probe.nvlink_domain_size)}


def labels_text(labels: Mapping[str, str]) -> str:
    """``key=value`` lines (the ``probe --format labels`` output)."""
    return "".join(f"{key}={value}\n" for key, value in sorted(labels.items()))


@dataclass(frozen=True)
class NodePatch:
    """The request that sets the labels (shown by ``--print-patch``, sent by :func:`send_patch`)."""

    url: str
    body: dict[str, object]
    method: str = "PATCH"
    content_type: str = "application/merge-patch+json"

    def to_dict(self) -> dict[str, object]:
        """The request as JSON-ready data (no credentials)."""
        return {"method": self.method, "url": self.url, "contentType": self.content_type, "body": self.body}


def in_cluster_api_server(env: Mapping[str, str]) -> str:
    """``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``.

    Raises:
        RuntimeError: The variables are missing (not running in a pod).
    """
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("KUBERNETES_SERVICE_HOST is not set: not running in a pod; pass --api-server")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"


def build_patch(api_server: str, node: str, labels: Mapping[str, str]) -> NodePatch:
    """The merge patch of ``/api/v1/nodes/<node>`` that sets ``labels``."""
    if not node:
        raise ValueError("the node name is empty: set NODE_NAME (downward API spec.nodeName) or --node-name")
    url = f"{api_server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    return NodePatch(url=url, body={"metadata": {"labels": dict(labels)}})


def send_patch(patch: NodePatch, token: str | None, ca_file: str | None, timeout_s: float = 30.0) -> int:
    """Send the patch; return the HTTP status.

    Args:
        patch: The request.
        token: The bearer token (None sends no Authorization header).
        ca_file: The CA bundle to verify the API server with (None: the system's).
        timeout_s: Request timeout.

    Raises:
        urllib.error.HTTPError: The API server refused (the message holds the status and reason).
        urllib.error.URLError: The API server could not be reached.
    """
    request = urllib.request.Request(
        patch.url, data=json.dumps(patch.body).encode("utf-8"), method=patch.method
    )
    request.add_header("Content-Type", patch.content_type)
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca_file) if patch.url.startswith("https:") else None
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return int(response.status)


def service_account_credentials(directory: Path | None = None) -> tuple[str | None, str | None]:
    """The pod's token and CA file (default directory :data:`SERVICE_ACCOUNT_DIR`), None for what is missing."""
    directory = directory or SERVICE_ACCOUNT_DIR
    token_file = directory / "token"
    ca_file = directory / "ca.crt"
    token = token_file.read_text(encoding="utf-8").strip() if token_file.is_file() else None
    return token, (str(ca_file) if ca_file.is_file() else None)


def node_name_from_env(env: Mapping[str, str] | None = None) -> str:
    """``$NODE_NAME`` (downward API ``spec.nodeName``), empty when not set."""
    return (env if env is not None else os.environ).get("NODE_NAME", "")
