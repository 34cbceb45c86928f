"""The devcluster's PKI: a CA, the API server's serving certificate, client certificates, the SA key.

Everything is generated with ``cryptography`` once per instance and lives in the instance directory.
Keys are EC P-256 (fast to generate, accepted by every component).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Certificates outlive any development session; the CA is regenerated with the instance.
_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def write_ca(directory: Path, common_name: str, stem: str = "ca") -> CertPair:
    """Create a self-signed CA in ``directory/<stem>.{crt,key}``.

    Args:
        directory: Where to write.
        common_name: The CA's subject CN.
        stem: The file name stem.

    Returns:
        The written pair.
    """
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def write_signed(
    ca: CertPair,
    directory: Path,
    stem: str,
    common_name: str,
    *,
    organization: str | None = None,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
) -> CertPair:
    """Issue a certificate signed by ``ca`` into ``directory/<stem>.{crt,key}``.

    Args:
        ca: The issuing CA.
        directory: Where to write.
        stem: The file name stem.
        common_name: Subject CN (for a client certificate: the Kubernetes user name).
        organization: Subject O (for a client certificate: the Kubernetes group, e.g. ``system:masters``).
        server_names: DNS subject alternative names; with ``server_ips``, makes it a serving certificate.
        server_ips: IP subject alternative names.

    Returns:
        The written pair.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key} is not an EC private key")
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    is_server = bool(server_names or server_ips)
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if is_server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if is_server:
        alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def write_service_account_keys(directory: Path) -> CertPair:
    """Create the key pair that signs ServiceAccount tokens: ``sa.key`` (private) and ``sa.pub``.

    Returns:
        ``CertPair(cert=sa.pub, key=sa.key)``.
    """
    key = _key()
    pair = CertPair(directory / "sa.pub", directory / "sa.key")
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
