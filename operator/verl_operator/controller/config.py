"""Settings of one ``verl-operator run`` process (set by the command before kopf starts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl_contract.progress import PROGRESS_PORT


@dataclass(frozen=True)
class RunConfig:
    """Operator settings.

    Attributes:
        kubeconfig: Path of a kubeconfig; None for in-cluster or ``$KUBECONFIG``.
        webhook_port: Port of the validating webhook server; 0 disables admission.
        webhook_listen: Address the webhook server binds to.
        webhook_host: Host name or IP the API server uses to reach the webhook (managed mode).
        webhook_cert: Serving certificate (PEM); None generates a self-signed one into ``workdir``.
        webhook_key: Its private key.
        webhook_managed: Name of the ValidatingWebhookConfiguration kopf keeps up to date (local mode);
            None when something else (the Helm chart) manages it.
        metrics_port: Port of the Prometheus endpoint; 0 disables it.
        metrics_listen: Address the metrics endpoint binds to.
        resync_seconds: Safety resync: every job is reconciled at least this often, besides the reconciles its
            own changes, its pods', freed capacity and its TTL or deadline trigger.
        workers: Jobs reconciled at once (placements stay one at a time).
        workdir: Directory for generated files (the self-signed certificate).
        launcher_image: The operator's own image: Ray pods of jobs with ``verl.launcher: inject`` copy the
            launcher from it (None: they run ``verl-launcher`` from the job's image).
        policy_file: The administrator's admission policy (YAML, ``verl_operator.policy``); None: the defaults.
        leader_elect: Reconcile only while holding the Lease ``lease_namespace/lease_name``
            (``controller/leader.py``); False: this process always reconciles (one replica).
        lease_name: The Lease's name.
        lease_namespace: The Lease's namespace (required with ``leader_elect``).
        lease_duration: Seconds a standby waits after the Lease's last change before it takes it over.
        renew_deadline: Seconds the leader keeps reconciling without a successful renew.
        retry_period: Seconds between two attempts to acquire or renew.
        progress_port: The head pods' progress endpoint port (the launcher's ``--progress-port``); 0 reads none.
    """

    kubeconfig: str | None = None
    webhook_port: int = 0
    webhook_listen: str = "127.0.0.1"
    webhook_host: str | None = None
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_managed: str | None = None
    metrics_port: int = 0
    metrics_listen: str = "127.0.0.1"
    resync_seconds: float = 300.0
    workers: int = 4
    workdir: Path = Path(".verl-operator")
    launcher_image: str | None = None
    policy_file: str | None = None
    leader_elect: bool = False
    lease_name: str = "verl-operator"
    lease_namespace: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    progress_port: int = PROGRESS_PORT


CONFIG: list[RunConfig] = [RunConfig()]


def current() -> RunConfig:
    """The settings of this process."""
    return CONFIG[0]
