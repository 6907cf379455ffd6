"""The local cluster's certificates and passwords, made once in its state folder: a certificate authority, one
certificate for the nodes' addresses (as PEM for Kafka, as a PKCS#12 keystore for Cassandra), and a password
per service (docs/privacy.md "Encrypted transport"). On a real cluster these come from the operator's PKI and
Kubernetes Secrets; the settings name the files either way.

Why generated here rather than with openssl or keytool: `cryptography` is already a dependency (the keys of
runtime/keys.py), and one function makes every file the same way on every machine."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

YEARS = timedelta(days=3650)


@dataclass(frozen=True)
class Secured:
    """Where a secured cluster's files are."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def node_pem(self) -> Path:
        """The nodes' private key and certificate chain, PEM (Kafka's `ssl.keystore.type=PEM`)."""
        return self.folder / "node.pem"

    @property
    def node_p12(self) -> Path:
        """The same as a PKCS#12 keystore (Cassandra), with its password in `keystore-password`."""
        return self.folder / "node.p12"

    def password(self, name: str) -> str:
        """A service's password (made once): `keystore`, `cassandra`, `kafka-<user>`."""
        path = self.folder / f"{name}-password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def ensure(folder: Path, hosts: tuple[str, ...]) -> Secured:
    """The CA and the nodes' certificate for these addresses, made unless already there."""
    secured = Secured(folder)
    if secured.node_p12.exists():
        return secured
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    now = datetime.now(UTC) - timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("parley local cluster CA"))
        .issuer_name(_name("parley local cluster CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + YEARS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    names += [x509.IPAddress(ipaddress.ip_address(h)) for h in hosts]
    node = (
        x509.CertificateBuilder()
        .subject_name(_name("parley-node"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + YEARS)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    secured.ca.write_bytes(ca.public_bytes(pem))
    plain = serialization.NoEncryption()
    pkcs8 = serialization.PrivateFormat.PKCS8
    secured.node_pem.write_bytes(
        key.private_bytes(pem, pkcs8, plain) + node.public_bytes(pem) + ca.public_bytes(pem)
    )
    secured.node_pem.chmod(0o600)
    store = serialization.BestAvailableEncryption(secured.password("keystore").encode())
    secured.node_p12.write_bytes(
        pkcs12.serialize_key_and_certificates(b"node", key, node, [ca], store)
    )
    secured.node_p12.chmod(0o600)
    return secured
