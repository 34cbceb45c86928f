"""Text of the small Go modules that build the control-plane binaries (pure functions, no I/O).

``k8s.io/kubernetes`` cannot be required like an ordinary module: its ``go.mod`` replaces every ``k8s.io/*``
staging module with a path inside its own tree (``k8s.io/api => ./staging/src/k8s.io/api``). A module that
imports it must repeat those replacements, pointing each staging module at its published ``v0.X.Y`` version.
"""

from __future__ import annotations

import re

from verl_devtools.devcluster.versions import staging_version

# One replacement inside a ``replace ( ... )`` block or a single-line ``replace`` directive:
# ``k8s.io/api => ./staging/src/k8s.io/api``.
_STAGING_REPLACE = re.compile(
    r"^\s*(?:replace\s+)?(?P<module>k8s\.io/[A-Za-z0-9._/-]+)\s*=>\s*\./staging/\S+\s*$"
)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules that ``k8s.io/kubernetes`` replaces with paths inside its own tree.

    Args:
        kubernetes_go_mod: The text of ``k8s.io/kubernetes``'s ``go.mod``.

    Returns:
        The module paths (``k8s.io/api``, ...), sorted, without duplicates.

    Raises:
        ValueError: The text has no ``=> ./staging/...`` replacement (not a Kubernetes go.mod).
    """
    found: set[str] = set()
    for line in kubernetes_go_mod.splitlines():
        match = _STAGING_REPLACE.match(line.split("//", 1)[0])
        if match:
            found.add(match.group("module"))
    if not found:
        raise ValueError("the go.mod text has no 'k8s.io/... => ./staging/...' replacement")
    return sorted(found)


def kubernetes_tools_go_mod(
    kubernetes_go_mod: str,
    kubernetes_version: str,
    etcd_version: str,
    go_directive: str = "1.24.0",
) -> str:
    """The ``go.mod`` of the module that builds the Kubernetes binaries and etcd.

    Args:
        kubernetes_go_mod: The text of ``k8s.io/kubernetes``'s own ``go.mod`` at ``kubernetes_version``.
        kubernetes_version: The Kubernetes tag, e.g. ``v1.34.4``.
        etcd_version: The etcd tag, e.g. ``v3.6.4``.
        go_directive: The ``go`` line (the minimum the Kubernetes release needs).

    Returns:
        The go.mod text: requires ``k8s.io/kubernetes`` and ``go.etcd.io/etcd/server/v3`` and replaces each
        staging module with its ``v0.X.Y`` release. ``go mod tidy`` fills in the rest.
    """
    staging = staging_version(kubernetes_version)
    replaces = "\n".join(f"\t{m} => {m} {staging}" for m in staging_modules(kubernetes_go_mod))
    return (
        "module verl-operator.io/k8s-tools\n\n"
        f"go {go_directive}\n\n"
        "require (\n"
        f"\tgo.etcd.io/etcd/server/v3 {etcd_version}\n"
        f"\tk8s.io/kubernetes {kubernetes_version}\n"
        ")\n\n"
        f"replace (\n{replaces}\n)\n"
    )


def go_directive(go_mod: str) -> str:
    """The version on a go.mod's ``go`` line.

    Args:
        go_mod: go.mod text.

    Returns:
        The version, e.g. ``1.24.0``.

    Raises:
        ValueError: There is no ``go`` line.
    """
    match = re.search(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", go_mod, flags=re.MULTILINE)
    if match is None:
        raise ValueError("the go.mod text has no 'go' directive")
    return match.group(1)


#: Imports that keep the Kubernetes commands in the module's build list (read by ``go mod tidy``).
KUBERNETES_TOOLS_GO = """//go:build tools

package tools

import (
\t_ "k8s.io/kubernetes/cmd/kube-apiserver"
\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"
\t_ "k8s.io/kubernetes/cmd/kube-scheduler"
\t_ "k8s.io/kubernetes/cmd/kubectl"
)
"""

#: The node agents (kubelet, kube-proxy) of the real-node tier, in a module of their own.
KUBERNETES_NODE_TOOLS_GO = """//go:build tools

package tools

import (
\t_ "k8s.io/kubernetes/cmd/kube-proxy"
\t_ "k8s.io/kubernetes/cmd/kubelet"
)
"""

#: etcd has no importable ``main`` package: this one calls its entry point.
ETCD_MAIN_GO = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def single_tool_go_mod(module: str, version: str, go_directive: str = "1.24.0") -> str:
    """The ``go.mod`` of a module that builds one command of an ordinary Go module (kwok, helm).

    Args:
        module: The module path, e.g. ``sigs.k8s.io/kwok``.
        version: Its tag, e.g. ``v0.7.0``.
        go_directive: The ``go`` line.

    Returns:
        go.mod text requiring ``module@version``.
    """
    return f"module verl-operator.io/tools\n\ngo {go_directive}\n\nrequire {module} {version}\n"


def single_tool_go(package: str) -> str:
    """A ``tools.go`` that imports one command package so ``go mod tidy`` keeps its dependencies.

    Args:
        package: The command's import path, e.g. ``sigs.k8s.io/kwok/cmd/kwok``.

    Returns:
        Go source text.
    """
    return f'//go:build tools\n\npackage tools\n\nimport _ "{package}"\n'


#: Plugins of the real-node tier's CoreDNS, in the order they run (CoreDNS's own ``plugin.cfg`` order).
COREDNS_PLUGINS: tuple[str, ...] = ("bind", "ready", "health", "errors", "kubernetes")


def coredns_main_go(plugins: tuple[str, ...] = COREDNS_PLUGINS) -> str:
    """A CoreDNS ``main`` with only ``plugins`` compiled in (CoreDNS's documented way to pick plugins)."""
    imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{p}"\n' for p in plugins)
    directives = ", ".join(f'"{p}"' for p in plugins)
    return (
        "package main\n\nimport (\n"
        '\t"github.com/coredns/coredns/core/dnsserver"\n'
        '\t"github.com/coredns/coredns/coremain"\n'
        f"{imports})\n\n"
        f"func init() {{ dnsserver.Directives = []string{{{directives}}} }}\n\n"
        "func main() { coremain.Run() }\n"
    )
