"""Run ``verl-operator run`` as a local subprocess next to a devcluster (for ``make demo`` and the cluster tests).

The process listens on 127.0.0.1 only: health, metrics and a webhook server with a self-signed
certificate; it manages its own ValidatingWebhookConfiguration, which :meth:`LocalOperator.stop` deletes
(its failure policy is Fail, so a leftover one would block VerlJob writes once the process is gone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from verl_devtools.devcluster import process
from verl_devtools.devcluster.health import http_get, http_status
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, PortTaken, pick_free_ports, serves_certificate


class LocalOperatorError(RuntimeError):
    """The operator process did not start or died; the message has the tail of its log."""


class LocalOperator:
    """One ``verl-operator run`` subprocess against a kubeconfig.

    Args:
        kubeconfig: The cluster's kubeconfig.
        workdir: Directory for the log and the generated certificate.
        webhook_name: Name of the ValidatingWebhookConfiguration to manage (a domain with three or more
            segments); None runs without admission.
        namespaces: Namespace patterns to watch (empty: cluster-wide).
        env: Extra environment variables of the process.
        resync_seconds: ``--resync-seconds``; None: the operator's default (minutes: changes, freed capacity
            and scheduled TTL/deadline wake-ups drive every reconcile).
        serve_webhook: With ``webhook_name=None``: serve the webhook on :attr:`webhook_port` all the same,
            without a webhook configuration pointing at it (the HA test posts reviews to it directly).
        extra_args: More ``verl-operator run`` arguments (for example the leader election's flags).
        webhook_cert: The webhook's serving certificate and key (PEM files) instead of a generated
            self-signed one (replicas behind one relay share one certificate, as the chart's pods do).
    """

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        webhook_name: str | None = "local.verl-operator.io",
        namespaces: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        resync_seconds: float | None = None,
        serve_webhook: bool = False,
        extra_args: tuple[str, ...] = (),
        webhook_cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.webhook_cert = webhook_cert
        self.workdir = workdir
        self.webhook_name = webhook_name
        self.namespaces = namespaces
        self.env = dict(env or {})
        self.resync_seconds = resync_seconds
        self.serve_webhook = serve_webhook
        self.extra_args = extra_args
        self.health_port = self.metrics_port = self.webhook_port = 0
        self.pick_ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def pick_ports(self) -> None:
        """New free ports for health, metrics and the webhook (the process binds them when it starts)."""
        ports = pick_free_ports(("health", "metrics", "webhook"))
        self.health_port, self.metrics_port, self.webhook_port = (
            ports["health"],
            ports["metrics"],
            ports["webhook"],
        )

    @property
    def log_path(self) -> Path:
        """The process's combined stdout/stderr."""
        return self.workdir / "operator.log"

    @property
    def ca_path(self) -> Path:
        """The webhook's certificate: the given one, or the self-signed one the process writes (its own CA)."""
        if self.webhook_cert is not None:
            return self.webhook_cert[0]
        return self.workdir / "webhook" / "tls.crt"

    def argv(self) -> list[str]:
        """The command line (argv list, never a shell string)."""
        argv = [
            sys.executable,
            "-m",
            "verl_operator",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            f"--workdir={self.workdir}",
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            # kwok's pods have simulated IPs that no pod holds: the operator reads no head pod's progress
            # endpoint unless a test serves one and passes its own --progress-port (extra_args come last)
            "--progress-port=0",
        ]
        if self.resync_seconds is not None:
            argv.append(f"--resync-seconds={self.resync_seconds}")
        if self.webhook_name:
            argv += [f"--webhook-port={self.webhook_port}", f"--webhook-managed={self.webhook_name}"]
        elif self.serve_webhook:
            argv.append(f"--webhook-port={self.webhook_port}")
        if self.webhook_cert is not None and (self.webhook_name or self.serve_webhook):
            argv += [f"--webhook-cert={self.webhook_cert[0]}", f"--webhook-key={self.webhook_cert[1]}"]
        argv += [f"--namespace={ns}" for ns in self.namespaces]
        argv += list(self.extra_args)
        return argv

    def start(self, timeout: float = 60.0, attempts: int = 5) -> LocalOperator:
        """Start the process and wait until it serves: health answers and the webhook port is its own.

        The ports are picked free and bound by the process when it starts; another program can take one in
        between. The process then exits on its failed bind, or (the webhook) another listener answers in its
        place; either way this attempt is stopped and the next one starts on new ports. Once this returns, every
        port is bound by the process itself, so nothing else can answer on it while it runs.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(attempts):
            try:
                return self._start_once(timeout)
            except PortTaken:
                self.stop(delete_webhook=False)
                self.pick_ports()
        raise LocalOperatorError(
            f"the operator lost the race for its ports {attempts} times:\n{self.log_tail()}"
        )

    def _start_once(self, timeout: float) -> LocalOperator:
        self._log = self.log_path.open("ab")
        offset = self._log.tell()
        if self.webhook_cert is None:
            self.ca_path.unlink(
                missing_ok=True
            )  # the process writes a new one; never compare with the last one
        self.proc = subprocess.Popen(
            self.argv(), stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if ADDRESS_IN_USE in self.log_path.read_bytes()[offset:].decode(errors="replace").lower():
                    raise PortTaken(self.log_tail())
                raise LocalOperatorError(
                    f"the operator exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self.healthy() and self.webhook_is_own():
                return self
            time.sleep(0.2)
        raise LocalOperatorError(f"the operator did not become healthy in {timeout}s:\n{self.log_tail()}")

    def webhook_is_own(self) -> bool:
        """True when the webhook port presents this process's certificate (or no webhook is served).

        Raises:
            PortTaken: Another program answers on the webhook port.
        """
        if not (self.webhook_name or self.serve_webhook):
            return True
        try:
            cert = self.ca_path.read_bytes()
        except OSError:
            return False  # not written yet
        try:
            own = serves_certificate(self.webhook_port, cert)
        except ValueError:
            return False  # the file is being written
        if own is False:
            raise PortTaken(f"another program answers on the webhook port {self.webhook_port}")
        return bool(own)

    def healthy(self) -> bool:
        """True when ``/healthz`` answers 200."""
        return http_status(f"http://127.0.0.1:{self.health_port}", "/healthz", timeout=1) == 200

    def metrics(self) -> str:
        """The Prometheus exposition text.

        Raises:
            LocalOperatorError: The metrics endpoint does not answer 200.
        """
        answer = http_get(f"http://127.0.0.1:{self.metrics_port}", "/metrics")
        if answer is None or answer[0] != 200:
            raise LocalOperatorError(f"/metrics on port {self.metrics_port} answered {answer and answer[0]}")
        return answer[1].decode()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the log."""
        return process.log_tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL (a crash: no cleanup runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, delete_webhook: bool = True) -> None:
        """SIGTERM, wait, then SIGKILL if needed; delete the managed webhook configuration."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None
        if delete_webhook and self.webhook_name:
            self.delete_webhook_configuration()

    def delete_webhook_configuration(self) -> None:
        """Delete the ValidatingWebhookConfiguration this process managed (gone already is fine)."""
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException

        if not self.webhook_name:
            return
        api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        with api:
            for kind in ("validating", "mutating"):
                try:
                    adm = client.AdmissionregistrationV1Api(api)
                    if kind == "validating":
                        adm.delete_validating_webhook_configuration(self.webhook_name)
                    else:
                        adm.delete_mutating_webhook_configuration(self.webhook_name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise


class LocalRelay:
    """One ``verl-operator webhook-relay`` subprocess on 127.0.0.1 in front of local webhook servers.

    Args:
        workdir: Directory for the log.
        cert: The serving certificate and key (PEM files); the backends' certificates must chain to it.
        backends: The webhook servers' base URLs, tried in this order.
        backend_timeout: ``--backend-timeout``.
        deadline: ``--deadline``.
    """

    def __init__(
        self,
        workdir: Path,
        cert: tuple[Path, Path],
        backends: tuple[str, ...],
        backend_timeout: float = 3.0,
        deadline: float = 9.0,
    ) -> None:
        self.workdir, self.cert, self.backends = workdir, cert, backends
        self.backend_timeout, self.deadline = backend_timeout, deadline
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "relay.log"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line (argv list, never a shell string)."""
        return [
            sys.executable,
            "-m",
            "verl_operator",
            "webhook-relay",
            f"--port={self.port}",
            f"--cert={self.cert[0]}",
            f"--key={self.cert[1]}",
            *[f"--backend={url}" for url in self.backends],
            f"--backend-timeout={self.backend_timeout}",
            f"--deadline={self.deadline}",
            "--drain-seconds=0",
        ]

    def start(self, timeout: float = 30.0, attempts: int = 5) -> LocalRelay:
        """Start the process on a free port and wait until it serves its certificate there."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert = self.cert[0].read_bytes()
        for _ in range(attempts):
            self.port = pick_free_ports(("relay",))["relay"]
            self._log = self.log_path.open("ab")
            offset = self._log.tell()
            self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            own: bool | None = None
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                own = serves_certificate(self.port, cert)
                if own:
                    return self
                if own is False:  # another program took the port first
                    break
                time.sleep(0.1)
            else:
                self.stop()
                raise LocalOperatorError(f"the relay did not serve in {timeout}s:\n{self.log_tail()}")
            self.stop()
            taken = ADDRESS_IN_USE in self.log_path.read_bytes()[offset:].decode(errors="replace").lower()
            if not taken and own is not False:
                raise LocalOperatorError(f"the relay exited:\n{self.log_tail()}")
        raise LocalOperatorError(f"the relay lost the race for its port {attempts} times")

    def log_tail(self, lines: int = 40) -> str:
        return process.log_tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL if needed."""
        process.stop_child(self.proc, self._log)
        self._log = None


def install_crd(kubeconfig: Path, timeout: float = 30.0) -> None:
    """Create or update the generated VerlJob CRD and wait until it is Established."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from verl_operator.crdgen import build_crd

    crd: Any = build_crd()
    name = crd["metadata"]["name"]
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    with api:
        ext = client.ApiextensionsV1Api(api)
        try:
            current: Any = ext.read_custom_resource_definition(name)
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, crd)
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = ext.read_custom_resource_definition(name).status
            conds = (status.conditions if status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                return
            time.sleep(0.2)
    raise LocalOperatorError(f"CRD {name} not Established after {timeout}s")
