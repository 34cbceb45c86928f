"""Write an OCI image archive (``oci-layout``, ``index.json``, ``blobs/sha256/...``) from layer tarballs.

The archive is what ``ctr images import`` reads: no registry and no container engine are involved. Layers
are stored uncompressed (their digest is also their ``diff_id``), which keeps building and importing fast
on a local disk. The output is deterministic: the same layers and config give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
#: The annotation containerd's importer names the image by.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what a Dockerfile's ENV/ENTRYPOINT/CMD/USER set)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    user: str = ""
    working_dir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _json_bytes(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def config_document(config: ImageConfig, diff_ids: list[str]) -> dict[str, Any]:
    """The image config JSON (OCI image spec, ``application/vnd.oci.image.config.v1+json``)."""
    runtime: dict[str, Any] = {"Env": list(config.env), "WorkingDir": config.working_dir}
    if config.entrypoint:
        runtime["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        runtime["Cmd"] = list(config.cmd)
    if config.user:
        runtime["User"] = config.user
    if config.labels:
        runtime["Labels"] = dict(sorted(config.labels.items()))
    return {
        "architecture": "amd64",
        "os": "linux",
        # A fixed timestamp keeps the config (and so the image digest) a function of its content only.
        "created": "1970-01-01T00:00:00Z",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def write_archive(out: Path, layers: list[Path], config: ImageConfig, reference: str) -> str:
    """Write an OCI image archive with the given layers (bottom first).

    Args:
        out: The archive to write (replaced atomically).
        layers: Uncompressed layer tarballs, bottom first.
        config: Entrypoint, environment, user.
        reference: The image name with its tag (``ghcr.io/verl-operator/verl-operator:0.1.0``).

    Returns:
        The manifest digest (``sha256:...``).
    """
    digests = [file_digest(layer) for layer in layers]
    config_bytes = _json_bytes(config_document(config, digests))
    config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [
            {"mediaType": MEDIA_LAYER, "digest": digest, "size": layer.stat().st_size}
            for digest, layer in zip(digests, layers, strict=True)
        ],
    }
    manifest_bytes = _json_bytes(manifest)
    manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {CONTAINERD_NAME: reference, OCI_REF_NAME: reference.rsplit(":", 1)[-1]},
            }
        ],
    }
    partial = out.with_name(f".{out.name}.partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        _add_bytes(archive, "oci-layout", _json_bytes({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(archive, "index.json", _json_bytes(index))
        _add_bytes(archive, f"blobs/sha256/{config_digest.split(':')[1]}", config_bytes)
        _add_bytes(archive, f"blobs/sha256/{manifest_digest.split(':')[1]}", manifest_bytes)
        written: set[str] = set()
        for digest, layer in zip(digests, layers, strict=True):
            if digest in written:
                continue
            written.add(digest)
            info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':')[1]}")
            info.size = layer.stat().st_size
            info.mode = 0o644
            with layer.open("rb") as handle:
                archive.addfile(info, handle)
    partial.replace(out)
    return manifest_digest
