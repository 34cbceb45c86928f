"""Child names valid for their kind whatever the job's name (a digit first, dots, 40 characters), and the
admission dry run of every child the operator creates (pure builders)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import make_nodes

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.dryrun import dry_run_children
from verl_operator.controller.webhook import check_admission
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.names import (
    DNS_1035_LABEL,
    DNS_1123_LABEL,
    DNS_1123_SUBDOMAIN,
    MAX_JOB_NAME,
    ChildNames,
    dns_stem,
)

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SPEC = VerlJobSpec.model_validate(
    {
        "verl": {"image": "registry.example/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 24, "gpusPerNode": 8},
        "scheduling": {"queueName": "q"},
    }
)
PLAN = LaunchPlan(
    verl_version="0.9",
    nnodes=3,
    gpus_per_node=8,
    overrides=("trainer.nnodes=3",),
    nvlink_group_size=8,
    require_nvlink=False,
    gpu_product="NVIDIA-H100-80GB-HBM3",
    gpu_memory_mib=81559,
    nodes=(),
)
NAMES = [
    pytest.param("demo", id="plain"),
    pytest.param("1job", id="digit-first"),
    pytest.param("2024.run.7", id="digits-and-dots"),
    pytest.param("a.b", id="dots"),
    pytest.param("9" * MAX_JOB_NAME, id="40-digits"),
    pytest.param("a" * MAX_JOB_NAME, id="40-letters"),
    pytest.param("x." * 19 + "y", id="40-with-dots"),
]


def _valid(pattern: re.Pattern[str], name: str, longest: int) -> bool:
    return bool(pattern.match(name)) and len(name) <= longest


@pytest.mark.parametrize("job", NAMES)
def test_every_child_name_is_valid_for_its_kind(job: str) -> None:
    body = {"metadata": {"name": job, "namespace": "team", "uid": "u-1"}}
    children = build_children(body, SPEC, PLAN, attempt=12)
    kinds = {c["kind"] for c in children}
    assert kinds == {"ServiceAccount", "ConfigMap", "Service", "Pod"}
    for child in children:
        name, kind = child["metadata"]["name"], child["kind"]
        if kind == "Service":
            assert _valid(DNS_1035_LABEL, name, 63), name
        else:
            assert _valid(DNS_1123_SUBDOMAIN, name, 253), (kind, name)
        for value in child["metadata"]["labels"].values():
            assert _valid(LABEL_VALUE, value, 63), value
        if kind == "Pod":
            assert _valid(DNS_1123_LABEL, child["spec"]["hostname"], 63), child["spec"]["hostname"]
            assert child["spec"]["subdomain"] == ChildNames(job, "team").service
    names = ChildNames(job, "team")
    assert names.head_host == f"{names.head_hostname}.{names.service}.team.svc"
    # The largest worker index of the largest job still gives a valid hostname.
    assert _valid(DNS_1123_LABEL, names.hostname(16_383), 63)


def test_a_dns_label_name_is_used_as_it_is_and_others_get_a_stem_with_a_hash() -> None:
    assert dns_stem("demo") == "demo" and ChildNames("demo", "ns").service == "demo-ray"
    assert dns_stem("1job") == dns_stem("1job")  # deterministic: a restart finds its children
    assert dns_stem("1job").startswith("vj-1job-")
    # Names that read alike after the mapping (a dot, a dash) still get different stems.
    stems = {dns_stem(n) for n in ("a.b", "a-b", "A.b".lower(), "1a.b", "1a-b")}
    assert len(stems) == 4


def _plan_json(spec: VerlJobSpec) -> dict[str, Any]:
    checked = check_admission(spec.to_wire(), None, make_nodes(3, gpus=8))
    assert checked.plan is not None, checked.problems
    return checked.plan


@pytest.mark.parametrize(
    ("security", "kinds"),
    [
        pytest.param({}, ["ServiceAccount", "ConfigMap", "Service", "Pod", "Pod"], id="own-service-account"),
        pytest.param(
            {"serviceAccountName": "runner"}, ["ConfigMap", "Service", "Pod", "Pod"], id="named-account"
        ),
    ],
)
def test_the_dry_run_covers_every_kind_the_operator_creates(
    security: dict[str, Any], kinds: list[str]
) -> None:
    spec = SPEC.model_copy(update={"security": SPEC.security.model_validate(security)})
    children = dry_run_children("1job", "team", spec, _plan_json(spec), None)
    assert [c["kind"] for c in children] == kinds
    assert [c["metadata"]["labels"]["verl-operator.io/role"] for c in children if c["kind"] == "Pod"] == [
        "head",
        "worker",
    ]
    service = next(c for c in children if c["kind"] == "Service")
    assert DNS_1035_LABEL.match(service["metadata"]["name"])
    for child in children:
        assert "ownerReferences" not in child["metadata"]
        if child["kind"] == "Pod":
            assert ("serviceAccountName" in child["spec"]) is bool(security)
