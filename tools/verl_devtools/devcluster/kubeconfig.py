"""Kubeconfig files for the devcluster's users (admin, controller-manager, scheduler, kwok)."""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_devtools.devcluster.certs import CertPair


def kubeconfig_dict(
    cluster_name: str, server: str, ca: Path, client: CertPair, user: str
) -> dict[str, object]:
    """A kubeconfig with one cluster, one user (client certificate files) and one current context.

    Args:
        cluster_name: Name of the cluster and context entries (``verl-devcluster-<name>``).
        server: The API server URL.
        ca: The CA bundle file.
        client: The user's client certificate and key files.
        user: The user entry's name.

    Returns:
        The kubeconfig as a dict (absolute file paths, so it works from any directory).
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster_name, "cluster": {"server": server, "certificate-authority": str(ca.resolve())}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(client.cert.resolve()),
                    "client-key": str(client.key.resolve()),
                },
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path, cluster_name: str, server: str, ca: Path, client: CertPair, user: str
) -> Path:
    """Write :func:`kubeconfig_dict` to ``path`` (mode 0600) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig_dict(cluster_name, server, ca, client, user), sort_keys=False))
    path.chmod(0o600)
    return path
