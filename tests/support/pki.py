"""Certificates for the test suite's clusters (the e2e control plane, the real node): a private CA
and the certificates it signs, written as PEM files into a directory (the ``cryptography``
package, a test dependency)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CertKey:
    cert: Path
    key: Path


class CertFactory:
    """Writes PEM certificates and keys into a directory (with `cryptography`)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca: CertKey | None = None
        self._ca_objs: tuple[Any, Any] | None = None

    # -- public API
    def make_ca(self, common_name: str = "castslice-e2e-ca") -> CertKey:
        self.ca = self._make_ca(common_name)
        return self.ca

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> CertKey:
        """Issue a certificate signed by the CA, written to <name>.crt/.key."""
        if self._ca_objs is None:
            raise RuntimeError("make_ca() first")
        return self._issue(
            name,
            common_name,
            list(organizations),
            list(dns_names),
            list(ip_addresses),
            server,
            client,
        )

    def rsa_keypair(self, name: str) -> tuple[Path, Path]:
        """An RSA key pair: (<name>.key private PEM, <name>.pub public PEM)."""
        return self._keypair(name)

    # -- implementation
    def _write_key(self, path: Path, key: Any) -> None:
        from cryptography.hazmat.primitives import serialization

        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    @staticmethod
    def _new_rsa() -> Any:
        from cryptography.hazmat.primitives.asymmetric import rsa

        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def _builder(self, subject: Any, issuer: Any, public_key: Any) -> Any:
        from cryptography import x509

        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    def _make_ca(self, common_name: str) -> CertKey:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        key = self._new_rsa()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            self._builder(name, name, key.public_key())
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
        out = CertKey(self.dir / "ca.crt", self.dir / "ca.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(out.key, key)
        self._ca_objs = (cert, key)
        return out

    def _issue(
        self,
        name: str,
        common_name: str,
        orgs: list[str],
        dns: list[str],
        ips: list[str],
        server: bool,
        client: bool,
    ) -> CertKey:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        assert self._ca_objs is not None
        ca_cert, ca_key = self._ca_objs
        key = self._new_rsa()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            self._builder(x509.Name(attrs), ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        out = CertKey(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(out.key, key)
        return out

    def _keypair(self, name: str) -> tuple[Path, Path]:
        from cryptography.hazmat.primitives import serialization

        key = self._new_rsa()
        priv, pub = self.dir / f"{name}.key", self.dir / f"{name}.pub"
        self._write_key(priv, key)
        pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
        )
        return priv, pub
