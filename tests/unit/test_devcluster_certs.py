"""The devcluster PKI: a CA, serving and client certificates that chain to it."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from verl_devtools.devcluster import certs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.fixture
def ca(tmp_path: Path) -> certs.CertPair:
    return certs.write_ca(tmp_path, "test-ca")


def test_serving_certificate_chains_to_the_ca_and_names_loopback(ca: certs.CertPair, tmp_path: Path) -> None:
    pair = certs.write_signed(
        ca, tmp_path, "apiserver", "kube-apiserver", server_names=("localhost",), server_ips=("127.0.0.1",)
    )
    cert = load(pair.cert)
    cert.verify_directly_issued_by(load(ca.cert))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages


@pytest.mark.parametrize(
    ("user", "group"),
    [
        pytest.param("verl-operator-admin", "system:masters", id="admin"),
        pytest.param("system:kube-scheduler", None, id="scheduler"),
    ],
)
def test_client_certificate_carries_the_kubernetes_identity(
    ca: certs.CertPair, tmp_path: Path, user: str, group: str | None
) -> None:
    cert = load(certs.write_signed(ca, tmp_path, "client", user, organization=group).cert)
    cert.verify_directly_issued_by(load(ca.cert))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [user]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == (
        [group] if group else []
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_certificate_from_another_ca_does_not_chain(ca: certs.CertPair, tmp_path: Path) -> None:
    other = certs.write_ca(tmp_path, "other-ca", stem="other")
    cert = load(certs.write_signed(other, tmp_path, "x", "x").cert)
    with pytest.raises(ValueError, match="issuer"):
        cert.verify_directly_issued_by(load(ca.cert))


def test_private_keys_are_private(ca: certs.CertPair, tmp_path: Path) -> None:
    sa = certs.write_service_account_keys(tmp_path)
    assert ca.key.stat().st_mode & 0o077 == 0
    assert sa.key.stat().st_mode & 0o077 == 0
    assert b"PUBLIC KEY" in sa.cert.read_bytes()
