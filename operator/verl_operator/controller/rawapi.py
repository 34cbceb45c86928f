"""JSON requests to the API server over the kubernetes client's connections and credentials, nothing more.

The kubernetes client's generated methods (``CoreV1Api.create_namespaced_pod`` and the rest) check every
argument with pydantic's ``validate_call`` and build response models, on every call: during a batch of job
creations that was 15-19% of the operator's CPU, for bodies the operator builds itself as plain JSON. The
reconciler's and the admission's hot calls (pod, child and event creates, gate removals, status patches,
dry runs) go through :class:`RawAPI` instead: the same connection pool, TLS settings and credentials (a
bearer token is read from the configuration on every call, so a refreshed token is used), the same
:class:`~kubernetes.client.exceptions.ApiException` for an answer outside 2xx, and JSON encoded and decoded by
:mod:`orjson` (:func:`dumps`, :func:`loads`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def dumps(obj: Any) -> bytes:
    """``obj`` as JSON bytes; a value orjson does not encode (an integer beyond 64 bits) goes through the
    standard library instead, so every body the standard encoder took is still sent."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    """The JSON value of ``data``; what orjson refuses (a lone surrogate escape, nesting beyond 1024 levels)
    is read by the standard library, which raises its own error for invalid JSON.

    orjson reads an integer beyond 64 bits as a float; the API server, the only source read here, never
    sends one (it keeps a larger number of an unstructured field as a float itself)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def core_path(namespace: str, plural: str, name: str | None = None, sub: str | None = None) -> str:
    """``/api/v1/namespaces/<ns>/<plural>[/<name>[/<sub>]]`` with the names quoted."""
    return _path("/api/v1", namespace, plural, name, sub)


def group_path(
    group: str, version: str, namespace: str, plural: str, name: str | None = None, sub: str | None = None
) -> str:
    """``/apis/<group>/<version>/namespaces/<ns>/<plural>[/<name>[/<sub>]]`` with the names quoted."""
    return _path(f"/apis/{quote(group, safe='')}/{quote(version, safe='')}", namespace, plural, name, sub)


def _path(root: str, namespace: str, plural: str, name: str | None, sub: str | None) -> str:
    parts = [root, "namespaces", quote(namespace, safe=""), quote(plural, safe="")]
    if name is not None:
        parts.append(quote(name, safe=""))
        if sub is not None:
            parts.append(quote(sub, safe=""))
    return "/".join(parts)


class RawAPI:
    """One API request at a time per call, over ``api``'s pool (thread-safe, like the pool itself)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = JSON,
        decode: bool = True,
    ) -> Any:
        """Send ``body`` (JSON) to ``path``; the answer's JSON (None with ``decode=False``: read and dropped,
        which hands the connection back to the pool).

        Raises:
            ApiException: The API server answered outside 2xx (its ``status`` and ``body`` as the client's
                generated methods raise it).
        """
        config = self.api.configuration
        headers = {"Accept": JSON, "User-Agent": self.api.user_agent}
        auth = config.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers[auth["key"]] = auth["value"]
        data = None
        if body is not None:
            data = dumps(body)
            headers["Content-Type"] = content_type
        url = config.host + path
        if query:
            url += "?" + urlencode(query)
        response = self.api.rest_client.pool_manager.request(
            method, url, body=data, headers=headers, preload_content=True
        )
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        if not decode:
            return None
        return loads(response.data)
