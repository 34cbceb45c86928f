"""The generated Go module that builds the Kubernetes binaries: staging replacements and versions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_devtools.devcluster import gomod
from verl_devtools.devcluster.versions import staging_version

# The shape of k8s.io/kubernetes's go.mod: a replace block pointing staging modules into its own tree,
# plus entries that must not be mistaken for staging modules.
KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.24.0

godebug default=go1.24

require (
\tgithub.com/spf13/cobra v1.9.1
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/klog/v2 v2.130.1
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go // the client
\tk8s.io/kube-scheduler => ./staging/src/k8s.io/kube-scheduler
\tgithub.com/example/fork => github.com/example/fork v1.2.3
)

replace k8s.io/kubectl => ./staging/src/k8s.io/kubectl
"""


def test_staging_modules_are_exactly_the_in_tree_replacements() -> None:
    assert gomod.staging_modules(KUBERNETES_GO_MOD) == [
        "k8s.io/api",
        "k8s.io/client-go",
        "k8s.io/kube-scheduler",
        "k8s.io/kubectl",
    ]


def test_a_go_mod_without_staging_replacements_is_rejected() -> None:
    with pytest.raises(ValueError, match="staging"):
        gomod.staging_modules("module example.com/x\n\ngo 1.24.0\n")


def test_tools_go_mod_pins_every_staging_module_to_the_matching_release() -> None:
    text = gomod.kubernetes_tools_go_mod(KUBERNETES_GO_MOD, "v1.34.4", "v3.6.4", go_directive="1.24.0")
    replaced = dict(re.findall(r"^\t(k8s\.io/\S+) => \1 (v\S+)$", text, flags=re.MULTILINE))
    assert replaced == dict.fromkeys(gomod.staging_modules(KUBERNETES_GO_MOD), "v0.34.4")
    assert "\tk8s.io/kubernetes v1.34.4\n" in text
    assert "\tgo.etcd.io/etcd/server/v3 v3.6.4\n" in text
    assert re.search(r"^go 1\.24\.0$", text, flags=re.MULTILINE)
    assert "github.com/example/fork" not in text


@pytest.mark.parametrize(
    ("kubernetes", "staging"),
    [
        pytest.param("v1.34.4", "v0.34.4", id="1.34.4"),
        pytest.param("v1.30.0", "v0.30.0", id="1.30.0"),
        pytest.param("1.33.12", "v0.33.12", id="no-v-prefix"),
    ],
)
def test_staging_version(kubernetes: str, staging: str) -> None:
    assert staging_version(kubernetes) == staging


@pytest.mark.parametrize("bad", ["v2.0.0", "v1.34", "v1.34.4-rc.1", "latest", ""])
def test_staging_version_rejects_non_release_tags(bad: str) -> None:
    with pytest.raises(ValueError, match=r"v1\.X\.Y"):
        staging_version(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(KUBERNETES_GO_MOD, "1.24.0", id="kubernetes"),
        pytest.param("module x\n\ngo 1.23\n", "1.23", id="two-part"),
    ],
)
def test_go_directive(text: str, expected: str) -> None:
    assert gomod.go_directive(text) == expected


def test_go_directive_missing() -> None:
    with pytest.raises(ValueError, match="'go' directive"):
        gomod.go_directive("module x\n")


_segment = st.from_regex(r"[a-z][a-z0-9-]{0,14}", fullmatch=True)


@given(st.sets(_segment, min_size=1, max_size=12))
def test_any_set_of_staging_replacements_round_trips(names: set[str]) -> None:
    lines = "\n".join(f"\tk8s.io/{n} => ./staging/src/k8s.io/{n}" for n in names)
    text = f"module k8s.io/kubernetes\n\ngo 1.24.0\n\nreplace (\n{lines}\n)\n"
    assert gomod.staging_modules(text) == sorted(f"k8s.io/{n}" for n in names)
    tools = gomod.kubernetes_tools_go_mod(text, "v1.34.4", "v3.6.4")
    assert tools.count(" => ") == len(names)


def test_single_tool_module() -> None:
    text = gomod.single_tool_go_mod("sigs.k8s.io/kwok", "v0.7.0")
    assert "\nrequire sigs.k8s.io/kwok v0.7.0\n" in text
    assert gomod.single_tool_go("sigs.k8s.io/kwok/cmd/kwok").endswith(
        'import _ "sigs.k8s.io/kwok/cmd/kwok"\n'
    )
