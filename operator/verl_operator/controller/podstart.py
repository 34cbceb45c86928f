"""Why a Ray pod of a released gang cannot start, read from its containers' waiting reasons (pure).

The kubelet reports a container that it cannot start as ``state.waiting`` with a reason (``ImagePullBackOff``,
``CreateContainerConfigError``, ...); the pod stays ``Pending`` and keeps its GPUs. :func:`stuck` finds the
first such container of an attempt's pods and says what to fix: the image reference, the pull secret, or the
pod's configuration. A permanent reason (an image reference the kubelet cannot parse, an image that may
never be pulled) ends the attempt at once; a transient one (a registry that refuses or cannot be reached, a
Secret or ConfigMap that does not exist yet) ends it once it has lasted ``spec.startDeadlineSeconds``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The condition that names the container the kubelet cannot start (removed once no container waits so).
STARTABLE = "PodsStartable"

_PULL = (
    "the image cannot be pulled: check spec.verl.image and the pull secret (the imagePullSecrets of the Ray "
    "pods' ServiceAccount)"
)
#: Kubelet waiting reasons -> (the condition's reason, what to fix, permanent). Permanent: waiting longer
#: cannot help. ``InvalidImageName``: the reference does not parse (an upper-case repository);
#: ``ErrImageNeverPull``: ``imagePullPolicy: Never`` and the image is not on the node. The condition's reason
#: names the part to fix (the image, its pull, the pod's configuration) and stays the same while the kubelet
#: alternates between ``ErrImagePull`` and ``ImagePullBackOff``.
WAITING_REASONS: dict[str, tuple[str, str, bool]] = {
    "InvalidImageName": ("InvalidImage", "the image reference is invalid: fix spec.verl.image", True),
    "ErrImageNeverPull": (
        "InvalidImage",
        "the image is not on the node and spec.verl.imagePullPolicy is Never: pre-pull it or allow pulls",
        True,
    ),
    "ErrImagePull": ("ImagePullFailed", _PULL, False),
    "ImagePullBackOff": ("ImagePullFailed", _PULL, False),
    "RegistryUnavailable": ("ImagePullFailed", "the image's registry cannot be reached", False),
    # The kubelet's ``images.ErrImageInspect`` is spelled ``ImageInspectError`` (pkg/kubelet/images/types.go).
    "ImageInspectError": ("ImagePullFailed", "the node cannot inspect the image", False),
    "SignatureValidationFailed": (
        "InvalidImage",
        "the image's signature is refused by the node's policy: use a signed image the policy admits",
        True,
    ),
    "CreateContainerConfigError": (
        "ContainerConfigInvalid",
        "the container's configuration cannot be built: a Secret or ConfigMap that spec.env or spec.volumes "
        "names is missing, or a runAsNonRoot image runs as root",
        False,
    ),
    "CreateContainerError": (
        "ContainerCreateFailed",
        "the container runtime cannot create the container",
        False,
    ),
    "PreCreateHookError": (
        "ContainerCreateFailed",
        "the container runtime's pre-create hook refused the container",
        False,
    ),
    "RunContainerError": (
        "ContainerCreateFailed",
        "the container runtime cannot start the container (its command, a device or a mount)",
        False,
    ),
}


@dataclass(frozen=True)
class Stuck:
    """A container of the attempt that the kubelet cannot start.

    Attributes:
        reason: The condition's reason (``ImagePullFailed``; the kubelet's own is in the message).
        message: One line: the pod, the container, the image, the kubelet's message and what to fix.
        permanent: Waiting cannot help (the attempt ends at once).
    """

    reason: str
    message: str
    permanent: bool


def stuck(wanted: Sequence[str], current: Mapping[str, Mapping[str, Any]]) -> Stuck | None:
    """The first container of the attempt's pods (head first, init containers first) waiting with a reason
    of :data:`WAITING_REASONS`, or None.

    Example: the head's ``ray`` container waiting with ``InvalidImageName`` for ``ghcr.io/Example/VERL:1``
    -> ``Stuck("InvalidImage", "pod j-r0-head container ray (image ghcr.io/Example/VERL:1):
    InvalidImageName: ...; the image reference is invalid: fix spec.verl.image", permanent=True)``.
    """
    for name in wanted:
        pod = current.get(name)
        if pod is None:
            continue
        status = pod.get("status") or {}
        found = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        for cs in found:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason not in WAITING_REASONS:
                continue
            why, fix, permanent = WAITING_REASONS[reason]
            said = str(waiting.get("message") or "").strip()
            detail = f"{reason}: {said[:200]}" if said else reason
            text = (
                f"pod {name} container {cs.get('name', '?')} (image {cs.get('image', '?')}): {detail}; {fix}"
            )
            return Stuck(why, text, permanent)
    return None
