"""Admission checks of the validating webhook (pure part) and the self-signed webhook certificate."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
from conftest import make_nodes
from cryptography import x509

from verl_operator.controller.webhook import admission_problems, write_self_signed

NODES = make_nodes(2, gpus=8)


def spec(**sections: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "data": {"trainBatchSize": 64},
        "rollout": {"responsesPerPrompt": 4},
        "resources": {"gpus": 16, "gpusPerNode": 8},
    }
    doc.update(sections)
    return doc


@pytest.mark.parametrize(
    ("new", "old", "fragment"),
    [
        pytest.param(spec(), None, None, id="valid-create"),
        pytest.param(
            spec(data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1}),
            None,
            "use trainBatchSize 96 or 112",
            id="batch",
        ),
        pytest.param(spec(resources={"gpus": 0}), None, "spec.resources.gpus", id="schema-field-named"),
        pytest.param(spec(rollout={"tp": 2}), None, "spec.rollout.tp", id="unknown-field"),
        pytest.param(
            spec(verl={"image": "i", "entrypoint": "verl.trainer.main_ppo; rm -rf /"}),
            None,
            "spec.verl.entrypoint",
            id="entrypoint-not-a-module",
        ),
        pytest.param(
            spec(verl={"image": "i", "entrypoint": "my_trainers.grpo_main"}),
            None,
            None,
            id="entrypoint-another-module",
        ),
        pytest.param(
            spec(resources={"gpus": 64, "gpusPerNode": 8}), None, "spec.resources", id="too-few-nodes"
        ),
        pytest.param(spec(resources={"gpus": 64}), spec(resources={"gpus": 64}), None, id="unchanged-update"),
        pytest.param(
            spec(resources={"gpus": 64}, suspend=True),
            spec(resources={"gpus": 64}),
            None,
            id="suspend-update",
        ),
    ],
)
def test_admission_problems(new: dict[str, Any], old: dict[str, Any] | None, fragment: str | None) -> None:
    problems = admission_problems(new, old, NODES)
    if fragment is None:
        assert problems == []
    else:
        assert problems and any(fragment in p for p in problems), problems


def test_self_signed_certificate_covers_loopback(tmp_path: Path) -> None:
    cert_path, key_path = write_self_signed(tmp_path, hosts=("127.0.0.1", "localhost"))
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert key_path.stat().st_mode & 0o077 == 0, "the key is readable by its owner only"
