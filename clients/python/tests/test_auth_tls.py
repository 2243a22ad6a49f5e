"""Bearer tokens, tenant isolation, TLS and mutual TLS through the client's connection options,
against real ctxfold servers (subprocesses)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import TOKEN_A, TOKEN_B, Server, start_server
from ctxfold_client import AsyncClient, Client, CtxfoldError, ErrorReason, user
from helpers import ROOMY_CONFIG

# --- bearer tokens -------------------------------------------------------------------------------


def test_missing_or_wrong_token_is_unauthenticated(auth_server: Server) -> None:
    for token in (None, "sdk-token-wrong-000000000000"):
        with Client(auth_server.address, token=token) as client, pytest.raises(CtxfoldError) as raised:
            client.create_session(ROOMY_CONFIG)
        assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED


def test_bearer_token_and_tenant_isolation(auth_server: Server) -> None:
    with Client(auth_server.address, token=TOKEN_A) as alice, Client(auth_server.address, token=TOKEN_B) as bob:
        session = alice.create_session(ROOMY_CONFIG)
        alice.append_messages(session.id, [user("secret plans")])
        assert alice.get_session(session.id).head_seq == 1
        with pytest.raises(CtxfoldError) as raised:
            bob.get_session(session.id)
        assert raised.value.reason == ErrorReason.SESSION_NOT_FOUND
        assert session.id not in {s.id for s in bob.list_sessions()}
        assert session.id in {s.id for s in alice.list_sessions()}


async def test_bearer_token_async(auth_server: Server) -> None:
    async with AsyncClient(auth_server.address, token=TOKEN_B) as client:
        session = await client.create_session(ROOMY_CONFIG)
        view = await client.prepare(session.id, [user("hi")])
        assert [m.content for m in view.messages] == ["hi"]
    async with AsyncClient(auth_server.address) as anonymous:
        with pytest.raises(CtxfoldError) as raised:
            await anonymous.get_session(session.id)
        assert raised.value.code is grpc.StatusCode.UNAUTHENTICATED


# --- TLS and mutual TLS ----------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    *,
    usage: x509.ObjectIdentifier | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pki(folder: Path, ca_name: str) -> tuple[x509.Name, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    cert = _cert(ca_name, key, key, None)
    return cert.subject, key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_subject, ca_key, ca_cert = _pki(folder, "sdk test CA")
    _, other_key, _ = _pki(folder, "another CA")
    server_key, client_key, stranger_key = _key(), _key(), _key()
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server_cert = _cert("localhost", server_key, ca_key, ca_subject, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)
    client_cert = _cert("sdk client", client_key, ca_key, ca_subject, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger_issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")])
    stranger_cert = _cert("stranger", stranger_key, other_key, stranger_issuer, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return Pki(
        ca=_write_cert(folder / "ca.pem", ca_cert),
        server_cert=_write_cert(folder / "server.pem", server_cert),
        server_key=_write_key(folder / "server.key", server_key),
        client_cert=_write_cert(folder / "client.pem", client_cert),
        client_key=_write_key(folder / "client.key", client_key),
        stranger_cert=_write_cert(folder / "stranger.pem", stranger_cert),
        stranger_key=_write_key(folder / "stranger.key", stranger_key),
    )


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("tls"), "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("mtls"),
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
    )
    yield running
    running.stop()


def test_tls_with_a_private_ca(tls_server: Server, pki: Pki) -> None:
    with Client(tls_server.address, ca_cert=pki.ca) as client:  # a path
        assert client.create_session(ROOMY_CONFIG).id
    with Client(f"localhost:{tls_server.port}", ca_cert=pki.ca.read_bytes(), server_name="localhost") as client:
        assert client.create_session(ROOMY_CONFIG).id
    with Client(tls_server.address, timeout=5) as plaintext, pytest.raises(CtxfoldError) as raised:
        plaintext.create_session(ROOMY_CONFIG)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE


async def test_tls_async(tls_server: Server, pki: Pki) -> None:
    async with AsyncClient(tls_server.address, ca_cert=pki.ca.read_text()) as client:  # PEM text
        session = await client.create_session(ROOMY_CONFIG)
        assert (await client.get_session(session.id)).id == session.id


def test_mutual_tls(mtls_server: Server, pki: Pki) -> None:
    with Client(mtls_server.address, ca_cert=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key) as ok:
        assert ok.create_session(ROOMY_CONFIG).id
    for cert, key in ((None, None), (pki.stranger_cert, pki.stranger_key)):
        with (
            Client(mtls_server.address, ca_cert=pki.ca, client_cert=cert, client_key=key, timeout=5) as refused,
            pytest.raises(CtxfoldError) as raised,
        ):
            refused.create_session(ROOMY_CONFIG)
        assert raised.value.code is grpc.StatusCode.UNAVAILABLE
