"""Health probes of the devcluster's components and the local operator (HTTP(S) on loopback only).

Every probe goes through the kubernetes client's REST layer (``ApiClient.rest_client``), the same TLS and
client-certificate handling the tests and the operator use, with no retries: a probe that finds nothing
listening answers None at once.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError, InsecureRequestWarning

from verl_devtools.devcluster.layout import apiserver_url

#: The port name of each component whose ``/healthz`` is served over HTTPS with a self-signed certificate.
_SELF_SIGNED_HEALTHZ = {"kube-controller-manager": "controller_manager", "kube-scheduler": "scheduler"}


def http_get(
    base: str,
    path: str,
    *,
    ca: Path | None = None,
    cert: tuple[Path, Path] | None = None,
    verify: bool = True,
    timeout: float = 2.0,
) -> tuple[int, bytes] | None:
    """GET ``base + path``: ``(status, body)``, or None when nothing answers.

    Args:
        base: ``http(s)://127.0.0.1:<port>``.
        path: ``/healthz``, ``/readyz``, ``/metrics``.
        ca: CA bundle that signed the server's certificate.
        cert: Client certificate and key.
        verify: False for a component whose serving certificate is generated in memory (loopback only).
        timeout: Seconds for connecting and reading.
    """
    cfg = client.Configuration()
    cfg.host = base
    cfg.verify_ssl = verify
    cfg.retries = False
    if ca is not None:
        cfg.ssl_ca_cert = str(ca)
    if cert is not None:
        cfg.cert_file, cfg.key_file = str(cert[0]), str(cert[1])
    with client.ApiClient(cfg) as api, warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRequestWarning)
        try:
            response = api.rest_client.request("GET", base + path, _request_timeout=timeout)
        except ApiException as exc:  # clients before v35 raise for a status that is not 2xx
            return int(exc.status), str(exc.body or "").encode()
        except (HTTPError, OSError):
            return None
        body = response.data if response.data is not None else response.read()
    return int(response.status), bytes(body or b"")


def http_status(
    base: str,
    path: str,
    *,
    ca: Path | None = None,
    cert: tuple[Path, Path] | None = None,
    verify: bool = True,
    timeout: float = 2.0,
) -> int | None:
    """The HTTP status of :func:`http_get`, or None when nothing answers."""
    answer = http_get(base, path, ca=ca, cert=cert, verify=verify, timeout=timeout)
    return None if answer is None else answer[0]


def apiserver_ready(ports: dict[str, int], pki: Path, host: str = "127.0.0.1") -> bool:
    """Whether the API server answers ``/readyz`` with 200 to the admin client certificate."""
    if "apiserver" not in ports or not (pki / "admin.crt").is_file():
        return False
    admin = (pki / "admin.crt", pki / "admin.key")
    return http_status(apiserver_url(ports, host), "/readyz", ca=pki / "ca.crt", cert=admin) == 200


def component_healthy(component: str, ports: dict[str, int], pki: Path, host: str = "127.0.0.1") -> bool:
    """Whether a component reports itself healthy.

    Args:
        component: One of ``layout.COMPONENTS``.
        ports: The instance's ports.
        pki: The instance's PKI directory (for the API server's client certificate).
        host: The API server's address.
    """
    if component == "etcd":
        return http_status(f"http://127.0.0.1:{ports['etcd_client']}", "/health") == 200
    if component == "kube-apiserver":
        return apiserver_ready(ports, pki, host)
    if component in _SELF_SIGNED_HEALTHZ:
        # Their serving certificates are generated in memory; only loopback is contacted.
        port = ports[_SELF_SIGNED_HEALTHZ[component]]
        return http_status(f"https://127.0.0.1:{port}", "/healthz", verify=False) == 200
    return http_status(f"http://127.0.0.1:{ports['kwok']}", "/healthz") == 200
