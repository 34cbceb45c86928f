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
letter (``normalize.go``'s ``splitDockerDomain``); the whole name is at most 255 characters.
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
