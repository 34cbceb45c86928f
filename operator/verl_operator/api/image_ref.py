"""Container image references checked as the kubelet parses them (the OCI distribution reference grammar).

The kubelet parses a pod's image with ``github.com/distribution/reference`` (``ParseNormalizedNamed``) and
leaves the container waiting with ``InvalidImageName`` when it does not parse: the job would hold its GPUs
without ever starting. :func:`image_problem` applies the same grammar at admission (``reference/regexp.go``):

    reference       := name [ ":" tag ] [ "@" digest ]
    name            := [domain '/'] remote-name
    domain          := host [':' port-number]
    host            := domain-name | IPv4address | \\[ IPv6address \\]
    domain-name     := domain-component ['.' domain-component]*
    domain-component:= /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    remote-name     := path-component ['/' path-component]*
    path-component  := /[a-z0-9]+/ [ separator /[a-z0-9]+/ ]*
    separator       := /[_.]|__|[-]+/
    tag             := /[\\w][\\w.-]{0,127}/
    digest          := algorithm ":" /[0-9a-fA-F]{32,}/

The first component is the domain when it holds a ``.`` or a ``:``, is ``localhost`` or has an upper-case
letter (``normalize.go``'s ``splitDockerDomain``); the whole name is at most 255 characters. Beyond the
grammar, ``reference.Parse`` checks the digest with ``go-digest`` (``Digest.Validate``: an algorithm the
kubelet knows, ``sha256``, ``sha384`` or ``sha512``, with exactly 64, 96 or 128 lower-case hex digits) and
``ParseNormalizedNamed`` refuses a repository of 64 hex digits (it reads as an image ID): the kubelet leaves
such a container waiting with ``InvalidImageName``. A registry port outside 1-65535 parses, but no pull can
ever reach it (``ErrImagePull`` at every try): it is refused too.
"""

from __future__ import annotations

import re

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[_.]|__|[-]+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
#: ``reference.NameTotalLengthMax``.
NAME_MAX = 255
#: ``go-digest``'s algorithms the kubelet links (``crypto/sha256``, ``crypto/sha512``) -> hex digits.
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_IMAGE_ID = re.compile(r"[a-f0-9]{64}")


def _is_domain(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost" or first.lower() != first


def image_problem(image: str) -> str | None:
    """Why ``image`` is no valid image reference, with the nearest valid one where there is one; None when
    it parses.

    Example: ``ghcr.io/Example/VERL:0.9.1`` -> ``the repository Example/VERL has upper-case letters, which an
    image reference may not have (the kubelet leaves the container waiting with InvalidImageName): use
    ghcr.io/example/verl:0.9.1``.
    """
    rest, _, after = image.partition("@")
    digest = after if "@" in image else None
    if digest is not None and not _DIGEST.fullmatch(digest):
        return f"the digest {digest!r} is not algorithm:hex (at least 32 hex digits)"
    if digest is not None and (found := _digest_problem(digest)):
        return found
    name, tag = rest, None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            return f"the tag {tag!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)"
    if not name:
        return "the image has no repository"
    if len(name) > NAME_MAX:
        return f"the repository name has {len(name)} characters, more than {NAME_MAX}"
    parts = name.split("/")
    domain = parts[0] if len(parts) > 1 and _is_domain(parts[0]) else None
    path = parts[1:] if domain is not None else parts
    if domain is not None and not _DOMAIN.fullmatch(domain):
        return f"the registry {domain!r} is not a host name with an optional port"
    port = domain.rpartition(":")[2] if domain is not None and not domain.endswith("]") else ""
    if port.isdigit() and not 1 <= int(port) <= 65535:
        return (
            f"the registry {domain!r} has port {int(port)}, outside 1-65535: no pull can reach it (the kubelet "
            "would retry ErrImagePull until spec.startDeadlineSeconds)"
        )
    if _IMAGE_ID.fullmatch(image):
        return (
            f"the repository {name[:12]}... is 64 hex digits, which the kubelet reads as an image ID and refuses "
            "as a name (InvalidImageName): name the repository"
        )
    repository = "/".join(path)
    if all(_PATH_COMPONENT.fullmatch(p) for p in path):
        return None
    where = "InvalidImageName"
    lower = "/".join(p.lower() for p in path)
    if lower != repository and all(_PATH_COMPONENT.fullmatch(p) for p in lower.split("/")):
        fixed = "/".join(x for x in (domain, lower) if x)
        fixed += f":{tag}" if tag is not None else ""
        fixed += f"@{digest}" if digest is not None else ""
        return (
            f"the repository {repository} has upper-case letters, which an image reference may not have (the "
            f"kubelet leaves the container waiting with {where}): use {fixed}"
        )
    return (
        f"the repository {repository!r} is not a valid image path (lower-case letters and digits separated "
        f"by '/', '.', '_', '__' or '-'; the kubelet leaves the container waiting with {where})"
    )


def _digest_problem(digest: str) -> str | None:
    """What ``go-digest``'s ``Digest.Validate`` refuses in a digest the grammar accepts."""
    algorithm, _, hex_part = digest.partition(":")
    want = DIGEST_HEX.get(algorithm)
    if want is None:
        known = ", ".join(DIGEST_HEX)
        return f"the digest algorithm {algorithm!r} is not one the kubelet knows ({known}; InvalidImageName)"
    if len(hex_part) != want:
        return f"the {algorithm} digest has {len(hex_part)} hex digits, not {want} (InvalidImageName)"
    if hex_part != hex_part.lower():
        return f"the {algorithm} digest has upper-case hex digits; write them lower-case (InvalidImageName)"
    return None
