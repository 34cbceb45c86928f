"""kopf's webhook server, hardened for hostile admission requests.

- aiohttp reads at most 1 MiB of a request body by default and answers a larger AdmissionReview with 413,
  which the API server turns into a failed ``kubectl apply``; the API server itself accepts bodies of 3 MiB,
  and a review carries the object twice on UPDATE, so the limit here is 8 MiB.
- JSON nested deeper than Python's recursion limit (the API server accepts up to 10000 levels) makes
  ``json.loads`` raise ``RecursionError``, which kopf does not catch (an HTTP 500): here it is a denial.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp.web
import kopf

#: The largest AdmissionReview body read (two 3 MiB objects plus the review's own fields).
MAX_REVIEW_BYTES = 8 * 1024 * 1024
_UID = re.compile(r'"uid"\s*:\s*"([^"]{1,128})"')


def too_deep_review(text: str) -> dict[str, Any]:
    """The AdmissionReview that denies a request nested too deeply to parse (its uid read by a regex)."""
    match = _UID.search(text)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": match.group(1) if match else "",
            "allowed": False,
            "status": {
                "code": 422,
                "message": "VerlJob rejected:\n- spec: nests lists or mappings too deeply to check",
            },
        },
    }


class WebhookServer(kopf.WebhookServer):
    """``kopf.WebhookServer`` with the request limit and the nesting guard described above."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        request = request.clone(client_max_size=MAX_REVIEW_BYTES)
        try:
            response: aiohttp.web.Response = await kopf.WebhookServer._serve(fn, request)
        except RecursionError:
            return aiohttp.web.json_response(too_deep_review(await request.text()), dumps=json.dumps)
        return response
