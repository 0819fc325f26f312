"""``castslice certgen``: the webhook's serving certificate without cert-manager, the way
ingress-nginx's certgen job does it: a self-signed CA and a serving certificate in a Secret, and
the CA patched into the webhook configurations' ``caBundle``.

Idempotent, so a Job can run it on every apply: a Secret whose certificate covers the webhook's
names and is not due for renewal is kept, and a caBundle that already holds its CA is left as it
is. The CA's private key is never stored (nothing can sign with it once the Job ends); a renewal
makes a new CA, and the caBundle then holds the new CA and the previous one, so the apiserver
trusts the old certificate until the webhook has read the new one (``castslice serve`` reloads a
changed certificate within 30 s).

The Secret has the keys cert-manager writes (``tls.crt``, ``tls.key``, ``ca.crt``), so the
Deployment that mounts it does not care which of the two made it.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from function.contract import (
    CERT_RENEW_BEFORE_DAYS,
    FUNCTION_NAMESPACE,
    MUTATING_CONFIGURATIONS,
    VALIDATING_CONFIGURATIONS,
    WEBHOOK_SERVICE,
    WEBHOOK_TLS_SECRET,
)
from function.kube.client import JSON_PATCH, Api, ApiError, collection_path, kube_client, object_path

DEFAULT_NAMESPACE = FUNCTION_NAMESPACE
DEFAULT_SECRET = WEBHOOK_TLS_SECRET
DEFAULT_SERVICE = WEBHOOK_SERVICE
DEFAULT_MUTATING = MUTATING_CONFIGURATIONS
DEFAULT_VALIDATING = VALIDATING_CONFIGURATIONS
"""Every webhook configuration the manifests install (one that is not installed is skipped)."""
CA_DAYS = 3650
CERT_DAYS = 730
RENEW_BEFORE_DAYS = CERT_RENEW_BEFORE_DAYS


@dataclass(frozen=True)
class Issued:
    ca: bytes
    cert: bytes
    key: bytes


def service_names(service: str, namespace: str) -> list[str]:
    """The names the apiserver may use for ``clientConfig.service``."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(hosts: Sequence[str], now: datetime.datetime) -> Issued:
    """A fresh CA (ECDSA P-256, ``CA_DAYS``) and a serving certificate for ``hosts`` (DNS names or
    IP addresses, ``CERT_DAYS``) signed by it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    start = now - datetime.timedelta(minutes=5)  # a clock slightly behind still trusts it
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("castslice-webhook-ca"))
        .issuer_name(_name("castslice-webhook-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(_alt_names(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def renewal_reason(
    data: dict[str, bytes] | None, hosts: Sequence[str], now: datetime.datetime, renew_before_days: int
) -> str | None:
    """Why the Secret's certificate must be replaced, or None to keep it."""
    if not data or not all(data.get(key) for key in ("tls.crt", "tls.key", "ca.crt")):
        return "no certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        ca = x509.load_pem_x509_certificate(data["ca.crt"])
    except ValueError:
        return "the certificate in it is not PEM"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "its certificate is not issued by its ca.crt"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "its certificate names no host"
    names = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    names |= {str(n) for n in sans.get_values_for_type(x509.IPAddress)}
    missing = [host for host in hosts if host not in names]
    if missing:
        return f"its certificate does not name {', '.join(missing)}"
    if cert.not_valid_after_utc - now < datetime.timedelta(days=renew_before_days):
        return f"its certificate expires {cert.not_valid_after_utc:%Y-%m-%d}, within {renew_before_days} days"
    return None


def not_after(pem: bytes) -> str:
    return f"{x509.load_pem_x509_certificate(pem).not_valid_after_utc:%Y-%m-%d}"


def ca_bundle(new_ca: bytes, previous_ca: bytes | None) -> bytes:
    """The new CA, then the previous one while the webhook may still serve a certificate it issued."""
    if previous_ca and previous_ca.strip() != new_ca.strip():
        return new_ca.rstrip(b"\n") + b"\n" + previous_ca.strip() + b"\n"
    return new_ca


# --- the cluster side -----------------------------------------------------------------------------


def _secret(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
    response = api.request("GET", object_path("", "v1", "secrets", namespace, name))
    if response.status == 404:
        return None
    if not response.ok:
        raise ApiError(f"get secret {namespace}/{name}", response)
    return dict(response.body)


def _decoded(secret: dict[str, Any] | None) -> dict[str, bytes] | None:
    if secret is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _owner(api: Api, namespace: str, account: str | None) -> list[dict[str, str]] | None:
    """The ownerReferences that make ``account`` (a ServiceAccount) own the Secret, so deleting
    it (``helm uninstall``, ``kubectl delete -k``) deletes the Secret too; None without an
    account, or while it does not exist yet (a pre-install hook): the next run adds it."""
    if not account:
        return None
    response = api.request("GET", object_path("", "v1", "serviceaccounts", namespace, account))
    if response.status == 404:
        return None
    if not response.ok:
        raise ApiError(f"get serviceaccount {namespace}/{account}", response)
    uid = str((response.body.get("metadata") or {}).get("uid") or "")
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "name": account, "uid": uid}] if uid else None


def _owned_by(secret: dict[str, Any] | None, owner: list[dict[str, str]] | None) -> bool:
    """Whether the Secret already carries ``owner`` (or there is none to give it)."""
    if owner is None or secret is None:
        return True
    held = (secret.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(ref, dict) and ref.get("uid") == owner[0]["uid"] for ref in held)


def _write_secret(
    api: Api,
    namespace: str,
    name: str,
    data: dict[str, bytes],
    exists: bool,
    owner: list[dict[str, str]] | None = None,
) -> None:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/part-of": "castslice",
            "app.kubernetes.io/managed-by": "castslice-certgen",
        },
    }
    if owner is not None:
        metadata["ownerReferences"] = owner
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "kubernetes.io/tls",
        "data": {key: base64.b64encode(data[key]).decode() for key in ("tls.crt", "tls.key", "ca.crt")},
    }
    if exists:
        response = api.request("PUT", object_path("", "v1", "secrets", namespace, name), body=body)
    else:
        response = api.request("POST", collection_path("", "v1", "secrets", namespace), body=body)
    if not response.ok:
        raise ApiError(f"{'replace' if exists else 'create'} secret {namespace}/{name}", response)


def _patch_bundle(api: Api, kind: str, name: str, bundle: bytes, out: Any) -> bool:
    """Set every webhook's caBundle of one configuration; False when it does not exist."""
    plural = f"{kind}s"
    path = object_path("admissionregistration.k8s.io", "v1", plural, "", name)
    response = api.request("GET", path)
    if response.status == 404:
        print(f"{kind}/{name}: not found, skipped", file=out)
        return False
    if not response.ok:
        raise ApiError(f"get {kind}/{name}", response)
    encoded = base64.b64encode(bundle).decode()
    hooks = response.body.get("webhooks") or []
    current = [(hook.get("clientConfig") or {}).get("caBundle") or "" for hook in hooks]
    stale = [i for i, held in enumerate(current) if held != encoded]
    if not stale:
        print(f"{kind}/{name}: caBundle already current", file=out)
        return True
    operations = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded} for i in stale
    ]
    patched = api.request("PATCH", path, body=operations, content_type=JSON_PATCH)
    if not patched.ok:
        raise ApiError(f"patch {kind}/{name}", patched)
    print(f"{kind}/{name}: caBundle patched ({len(stale)} of {len(hooks)} webhooks)", file=out)
    return True


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    hosts = [*service_names(args.service, namespace), *args.host]
    now = datetime.datetime.now(datetime.UTC)
    try:
        api = kube_client(user_agent="castslice-certgen")
        secret = _secret(api, namespace, args.secret)
        data, exists = _decoded(secret), secret is not None
        owner = _owner(api, namespace, getattr(args, "owner_service_account", None))
        reason = renewal_reason(data, hosts, now, args.renew_before_days)
        where = f"secret {namespace}/{args.secret}"
        if reason is None:
            assert data is not None
            bundle = data["ca.crt"]
            if not _owned_by(secret, owner):
                _write_secret(api, namespace, args.secret, data, True, owner)
                print(f"{where}: now owned by serviceaccount {args.owner_service_account}", file=out)
            print(f"{where}: kept (valid until {not_after(data['tls.crt'])})", file=out)
        else:
            issued = issue(hosts, now)
            written = {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": issued.ca}
            _write_secret(api, namespace, args.secret, written, exists, owner)
            bundle = ca_bundle(issued.ca, (data or {}).get("ca.crt"))
            verb = "replaced" if exists else "created"
            print(
                f"{where}: {verb} ({reason}): CA and serving certificate for {', '.join(hosts)}, "
                f"valid until {not_after(issued.cert)}",
                file=out,
            )
        for name in args.mutating or DEFAULT_MUTATING:
            _patch_bundle(api, "mutatingwebhookconfiguration", name, bundle, out)
        for name in args.validating or DEFAULT_VALIDATING:
            _patch_bundle(api, "validatingwebhookconfiguration", name, bundle, out)
    except Exception as error:  # noqa: BLE001  (one line for the Job's log; the Job retries)
        print(f"castslice certgen: {api_error_line(error)}", file=sys.stderr)
        return 1
    return 0


def api_error_line(error: Exception) -> str:
    """One line for an API error (status, reason, the apiserver's message), else the exception."""
    if isinstance(error, ApiError):
        try:
            reason = HTTPStatus(error.status).phrase
        except ValueError:  # not an HTTP status (0: no answer)
            reason = ""
        message = error.response.body.get("message") or error.response.text
        return f"{error.status} {reason}: {message}".rstrip(": ")
    return f"{type(error).__name__}: {error}"
