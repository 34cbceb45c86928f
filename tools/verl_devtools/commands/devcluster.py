"""``verl-operator-dev devcluster``: the local control plane with simulated GPU nodes (up, down, status, ...)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from verl_devtools.devcluster import DevCluster, DevClusterError, binaries, kueue, projectimages
from verl_devtools.devcluster.binaries import BinaryError
from verl_devtools.devcluster.imagebuild import ImageBuildError
from verl_devtools.devcluster.layout import COMPONENTS
from verl_devtools.devcluster.nodes import format_table
from verl_devtools.devcluster.profiles import DEFAULT_PROFILE, available_profiles
from verl_devtools.devcluster.realnodes import RealNodeError
from verl_operator.clusters.profile import ProfileError

_ALL_BINARIES: tuple[str, ...] = (*COMPONENTS, "kubectl", "helm")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``devcluster`` and its subcommands."""
    parser = subparsers.add_parser(
        "devcluster",
        help="a real local Kubernetes control plane with simulated GPU nodes",
        description=(
            "Run etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on loopback, with "
            "simulated GPU nodes from a profile. Binaries are found or built once into the cache "
            "($VERL_OPERATOR_CACHE, default ~/.cache/verl-operator)."
        ),
    )
    sub = parser.add_subparsers(dest="devcluster_command", metavar="SUBCOMMAND", required=True)

    def named(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--name", default="default", help="instance name (default: %(default)s)")
        return p

    up = named("up", "start the instance (idempotent) and apply a profile's nodes")
    up.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"profile name ({', '.join(available_profiles())}) or a YAML path (default: %(default)s)",
    )
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="N",
        help="also run N (>= 2) real kubelet nodes with containerd that run real containers (root; see "
        "docs/devcluster.md); fixed when the instance is first created",
    )
    up.add_argument(
        "--real-node-gpus",
        type=int,
        default=2,
        metavar="G",
        help="nvidia.com/gpu capacity each real node advertises (default: %(default)s)",
    )
    up.add_argument(
        "--scheduler",
        choices=("default", "kueue"),
        default="default",
        help="kueue: also run Kueue's controller manager (built from its Go module, out of cluster) so "
        "VerlJobs with spec.scheduling.queueName are admitted by it (see docs/devcluster.md)",
    )
    up.set_defaults(func=_up)

    down = named("down", "stop every process of the instance and remove its files")
    down.set_defaults(func=_down)

    status = named("status", "show the components and the nodes")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.set_defaults(func=_status)

    kubeconfig = named("kubeconfig", "print the path of the admin kubeconfig")
    kubeconfig.set_defaults(func=_kubeconfig)

    env = named("env", "print `export KUBECONFIG=...` for eval in a shell")
    env.set_defaults(func=_env)

    image = sub.add_parser(
        "image",
        help="build the operator image without a container engine and print the OCI archive's path",
        description=(
            "Build the operator image as the Dockerfile does, from Debian packages (mmdebstrap, as root) and "
            "this source tree, into an OCI archive in the cache (push it with `skopeo copy "
            "oci-archive:PATH docker://REGISTRY/IMAGE:TAG`). With --name, also import it into that "
            "instance's real nodes."
        ),
    )
    image.add_argument("--name", default=None, help="import into this instance's real nodes")
    image.set_defaults(func=_image)

    found = sub.add_parser(
        "binaries", help="find or build the pinned binaries and print their paths and versions"
    )
    found.set_defaults(func=_binaries)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _up(args: argparse.Namespace) -> int:
    try:
        cluster = DevCluster(
            name=args.name,
            profile=args.profile,
            real_nodes=args.real_nodes,
            real_node_gpus=args.real_node_gpus,
        )
        cluster.up()
        if args.scheduler == "kueue":
            with cluster.api_client() as api:
                kueue.start_kueue(cluster.layout, cluster.name, api, progress=lambda m: print(f"[kueue] {m}"))
    except (DevClusterError, ProfileError, BinaryError, TimeoutError, RealNodeError, ImageBuildError) as exc:
        return _error(str(exc))
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"use it:     export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    return 0


def _down(args: argparse.Namespace) -> int:
    DevCluster(name=args.name).down()
    return 0


def _status(args: argparse.Namespace) -> int:
    state = DevCluster(name=args.name, progress=lambda _m: None).status()
    if args.output == "json":
        print(json.dumps(state.as_dict(), indent=2))
        return 0 if state.running else 3
    if not state.running:
        stopped = [c.name for c in state.components if not c.running]
        print(
            f"devcluster {args.name!r} is not running (stopped: {', '.join(stopped)}); start it with "
            f"`verl-operator-dev devcluster up --name {args.name}`"
        )
        return 3
    print(f"devcluster {state.name}: {state.server}  profiles: {', '.join(state.profiles) or '-'}")
    print(f"kubeconfig: {state.kubeconfig}")
    print(format_table(list(state.nodes)))
    return 0


def _kubeconfig(args: argparse.Namespace) -> int:
    cluster = DevCluster(name=args.name, progress=lambda _m: None)
    if not cluster.kubeconfig.is_file():
        return _error(f"devcluster {args.name!r} has no kubeconfig: run `verl-operator-dev devcluster up`")
    print(cluster.kubeconfig)
    return 0


def _env(args: argparse.Namespace) -> int:
    cluster = DevCluster(name=args.name, progress=lambda _m: None)
    if not cluster.kubeconfig.is_file():
        return _error(f"devcluster {args.name!r} has no kubeconfig: run `verl-operator-dev devcluster up`")
    print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    return 0


def _image(args: argparse.Namespace) -> int:
    try:
        archive = projectimages.build_operator_image()
        if args.name:
            DevCluster(name=args.name).import_image(archive)
    except (ImageBuildError, DevClusterError, RealNodeError) as exc:
        return _error(str(exc))
    print(f"{projectimages.operator_image()}  {archive}  ({archive.stat().st_size >> 20} MiB)")
    return 0


def _binaries(args: argparse.Namespace) -> int:
    try:
        paths = binaries.ensure(_ALL_BINARIES)
    except BinaryError as exc:
        return _error(str(exc))
    for name in _ALL_BINARIES:
        located = binaries.find(name)
        version, source = (located.version, located.source) if located else ("?", "?")
        print(f"{name:<24} {version:<8} {source:<18} {paths[name]}")
    return 0
