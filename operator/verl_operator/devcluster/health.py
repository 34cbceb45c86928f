"""Health probes of the devcluster's components (HTTP(S) on loopback only)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

from verl_operator.devcluster.layout import apiserver_url

#: The port name of each component whose ``/healthz`` is served over HTTPS with a self-signed certificate.
_SELF_SIGNED_HEALTHZ = {"kube-controller-manager": "controller_manager", "kube-scheduler": "scheduler"}


def http_status(url: str, context: ssl.SSLContext | None, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # loopback only
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def apiserver_ready(ports: dict[str, int], pki: Path, host: str = "127.0.0.1") -> bool:
    """Whether the API server answers ``/readyz`` with 200 to the admin client certificate."""
    if "apiserver" not in ports or not (pki / "admin.crt").is_file():
        return False
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return http_status(f"{apiserver_url(ports, host)}/readyz", context) == 200


def component_healthy(component: str, ports: dict[str, int], pki: Path, host: str = "127.0.0.1") -> bool:
    """Whether a component reports itself healthy.

    Args:
        component: One of ``layout.COMPONENTS``.
        ports: The instance's ports.
        pki: The instance's PKI directory (for the API server's client certificate).
        host: The API server's address.
    """
    if component == "etcd":
        return http_status(f"http://127.0.0.1:{ports['etcd_client']}/health", None) == 200
    if component == "kube-apiserver":
        return apiserver_ready(ports, pki, host)
    if component in _SELF_SIGNED_HEALTHZ:
        # Their serving certificates are generated in memory; only loopback is contacted.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        return (
            http_status(f"https://127.0.0.1:{ports[_SELF_SIGNED_HEALTHZ[component]]}/healthz", insecure)
            == 200
        )
    return http_status(f"http://127.0.0.1:{ports['kwok']}/healthz", None) == 200
