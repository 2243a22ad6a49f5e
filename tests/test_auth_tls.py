"""Bearer-token authentication, tenant isolation (SPEC §1.8) and TLS / mutual TLS, on both backends.

Every server here is a real ctxfold server (ctxfold.server.start) on a loopback port, spoken to by a
real gRPC client."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from conftest import fresh_database, settings_for
from ctxfold.server import RunningServer, start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

TOKEN_A = "tok-alpha-0123456789abcdef"
TOKEN_B = "tok-bravo-0123456789abcdef"
SERVICE = "ctxfold.v1.ContextService"
TIMEOUT = 10.0


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


A = bearer(TOKEN_A)
B = bearer(TOKEN_B)


def rich_status(error: grpc.aio.AioRpcError) -> tuple[status_pb2.Status, error_details_pb2.ErrorInfo]:
    status = rpc_status.from_call(error)
    assert status is not None, f"no google.rpc.Status in the trailers of {error.code()}: {error.details()}"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1, f"expected exactly one ErrorInfo, got {status}"
    return status, infos[0]


async def rpc_error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    return raised.value


# --- authentication and tenant isolation ------------------------------------------------------------


@dataclass
class AuthServer:
    running: RunningServer
    channel: grpc.aio.Channel
    stub: pb_grpc.ContextServiceStub


@pytest.fixture(scope="module")
async def auth_server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthServer]:
    tmp = tmp_path_factory.mktemp(f"auth-{backend}")
    tokens = tmp / "tokens"
    tokens.write_text(f"# ctxfold tokens\n{TOKEN_A} tenant-a\n\n{TOKEN_B}   tenant-b  # second tenant\n")
    running = await start(settings_for(await fresh_database(backend, tmp), auth_tokens_file=str(tokens)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield AuthServer(running, channel, pb_grpc.ContextServiceStub(channel))
    finally:
        await running.stop(grace=1.0)


async def test_no_token_is_unauthenticated(auth_server: AuthServer) -> None:
    stub = auth_server.stub
    for call in (
        stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000)), timeout=TIMEOUT),
        stub.ListSessions(pb.ListSessionsRequest(), timeout=TIMEOUT),
        stub.GetSession(pb.GetSessionRequest(session_id="s_whatever"), timeout=TIMEOUT),
    ):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        status, info = rich_status(error)
        assert status.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert info.reason == "UNAUTHENTICATED"
        assert info.domain == "ctxfold.dev"
        assert "bearer" in error.details().lower()


@pytest.mark.parametrize(
    "header",
    [
        "Bearer tok-charlie-0123456789abcdef",  # well-formed but unknown
        f"Bearer {TOKEN_A}x",  # a known token with a suffix
        f"Basic {TOKEN_A}",  # the right token under the wrong scheme
        "Bearer",  # no token at all
    ],
)
async def test_wrong_token_is_unauthenticated(auth_server: AuthServer, header: str) -> None:
    error = await rpc_error(
        auth_server.stub.ListSessions(pb.ListSessionsRequest(), metadata=(("authorization", header),), timeout=TIMEOUT)
    )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    _, info = rich_status(error)
    assert info.reason == "UNAUTHENTICATED"
    # The server never echoes a presented credential back.
    assert TOKEN_A not in error.details()
    assert "charlie" not in error.details()


async def test_a_valid_token_is_accepted_with_any_scheme_case(auth_server: AuthServer) -> None:
    response = await auth_server.stub.ListSessions(
        pb.ListSessionsRequest(), metadata=(("authorization", f"bearer {TOKEN_A}"),), timeout=TIMEOUT
    )
    assert isinstance(response, pb.ListSessionsResponse)


async def _session_with_tool_result(stub: pb_grpc.ContextServiceStub) -> tuple[str, str]:
    created = await stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(context_window=16000, tool_content_max_bytes=4096)),
        metadata=A,
        timeout=TIMEOUT,
    )
    session_id = created.session.id
    appended = await stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session_id,
            messages=[
                pb.Message(role=pb.ROLE_USER, content="list the files"),
                pb.Message(
                    role=pb.ROLE_ASSISTANT,
                    tool_calls=[pb.ToolCall(id="call_1", name="ls", arguments="{}")],
                ),
                pb.Message(role=pb.ROLE_TOOL, tool_call_id="call_1", content="secret-of-a\n" * 1000),
            ],
        ),
        metadata=A,
        timeout=TIMEOUT,
    )
    result_ref = appended.messages[2].result_ref
    assert appended.messages[2].truncated and result_ref
    return session_id, result_ref


def _normalized(error: grpc.aio.AioRpcError, session_id: str) -> tuple[object, ...]:
    """The error with `session_id` replaced by a placeholder everywhere it appears."""
    status, info = rich_status(error)
    placeholder = "<SESSION>"
    info.metadata.update({k: v.replace(session_id, placeholder) for k, v in info.metadata.items()})
    return (
        error.code(),
        error.details().replace(session_id, placeholder),
        status.code,
        status.message.replace(session_id, placeholder),
        info.reason,
        info.domain,
        dict(info.metadata),
    )


async def test_another_tenants_session_looks_exactly_like_a_missing_one(auth_server: AuthServer) -> None:
    stub = auth_server.stub
    a_session, result_ref = await _session_with_tool_result(stub)
    missing = f"s_{uuid.uuid4().hex}"
    assert len(missing) == len(a_session)

    def calls(session_id: str) -> dict[str, Callable[[], object]]:
        return {
            "GetSession": lambda: stub.GetSession(
                pb.GetSessionRequest(session_id=session_id), metadata=B, timeout=TIMEOUT
            ),
            "AppendMessages": lambda: stub.AppendMessages(
                pb.AppendMessagesRequest(
                    session_id=session_id, messages=[pb.Message(role=pb.ROLE_USER, content="injected by b")]
                ),
                metadata=B,
                timeout=TIMEOUT,
            ),
            "ListMessages": lambda: stub.ListMessages(
                pb.ListMessagesRequest(session_id=session_id, include_abandoned=True), metadata=B, timeout=TIMEOUT
            ),
            "ReadToolResult by tool_call_id": lambda: stub.ReadToolResult(
                pb.ReadToolResultRequest(session_id=session_id, tool_call_id="call_1"), metadata=B, timeout=TIMEOUT
            ),
            "ReadToolResult by result_ref": lambda: stub.ReadToolResult(
                pb.ReadToolResultRequest(session_id=session_id, result_ref=result_ref), metadata=B, timeout=TIMEOUT
            ),
            "ListCheckpoints": lambda: stub.ListCheckpoints(
                pb.ListCheckpointsRequest(session_id=session_id, include_abandoned=True), metadata=B, timeout=TIMEOUT
            ),
            "GetCheckpoint": lambda: stub.GetCheckpoint(
                pb.GetCheckpointRequest(session_id=session_id, checkpoint_id="k_1"), metadata=B, timeout=TIMEOUT
            ),
            "DeleteSession": lambda: stub.DeleteSession(
                pb.DeleteSessionRequest(session_id=session_id), metadata=B, timeout=TIMEOUT
            ),
        }

    for (name, foreign_call), missing_call in zip(calls(a_session).items(), calls(missing).values(), strict=True):
        foreign = await rpc_error(foreign_call())
        absent = await rpc_error(missing_call())
        assert foreign.code() == grpc.StatusCode.NOT_FOUND, f"{name}: {foreign.code()} {foreign.details()}"
        assert _normalized(foreign, a_session) == _normalized(absent, missing), name
        assert rich_status(foreign)[1].reason == "SESSION_NOT_FOUND", name
        assert "secret-of-a" not in foreign.details()

    # Nothing B tried changed A's session.
    got = await stub.GetSession(pb.GetSessionRequest(session_id=a_session), metadata=A, timeout=TIMEOUT)
    assert got.session.head_seq == 3
    listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=a_session), metadata=A, timeout=TIMEOUT)
    assert [m.seq for m in listed.messages] == [1, 2, 3]
    assert all("injected" not in m.content for m in listed.messages)
    page = await stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=a_session, result_ref=result_ref), metadata=A, timeout=TIMEOUT
    )
    assert page.data.startswith("secret-of-a\n")


async def test_list_sessions_shows_only_the_callers_tenant(auth_server: AuthServer) -> None:
    stub = auth_server.stub
    config = pb.SessionConfig(context_window=8000)
    a_ids = {
        (await stub.CreateSession(pb.CreateSessionRequest(config=config), metadata=A, timeout=TIMEOUT)).session.id
        for _ in range(2)
    }
    b_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config), metadata=B, timeout=TIMEOUT)).session.id

    async def all_ids(metadata: tuple[tuple[str, str], ...]) -> set[str]:
        ids: set[str] = set()
        token = ""
        while True:
            page = await stub.ListSessions(
                pb.ListSessionsRequest(page_size=1, page_token=token), metadata=metadata, timeout=TIMEOUT
            )
            ids.update(s.id for s in page.sessions)
            token = page.next_page_token
            if not token:
                return ids

    seen_by_a, seen_by_b = await all_ids(A), await all_ids(B)
    assert a_ids <= seen_by_a
    assert b_id not in seen_by_a
    assert b_id in seen_by_b
    assert not (seen_by_a & seen_by_b)

    # B deleting its own session works and leaves A's alone.
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=b_id), metadata=B, timeout=TIMEOUT)
    assert b_id not in await all_ids(B)
    assert a_ids <= await all_ids(A)


async def test_health_needs_no_token(auth_server: AuthServer) -> None:
    health = health_pb2_grpc.HealthStub(auth_server.channel)
    for service in ("", SERVICE):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


# --- TLS and mutual TLS ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: bytes
    client_key: bytes
    stranger_cert: bytes  # a client certificate from a CA the server does not trust
    stranger_key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    *,
    sans: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    is_ca = issuer is None
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer)
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(subject_key.public_key()), critical=False)
    )
    if is_ca:
        builder = builder.add_extension(
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
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    tmp = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert(ca_key, "ctxfold test CA", ca_key, None)
    server_key = _key()
    server = _cert(
        server_key,
        "ctxfold test server",
        ca_key,
        ca.subject,
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client_key = _key()
    client = _cert(client_key, "agent-1", ca_key, ca.subject, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other_ca_key = _key()
    other_ca = _cert(other_ca_key, "some other CA", other_ca_key, None)
    stranger_key = _key()
    stranger = _cert(stranger_key, "stranger", other_ca_key, other_ca.subject, usage=ExtendedKeyUsageOID.CLIENT_AUTH)

    (tmp / "ca.pem").write_bytes(_pem(ca))
    (tmp / "server.pem").write_bytes(_pem(server))
    (tmp / "server.key").write_bytes(_key_pem(server_key))
    yield Pki(
        ca=tmp / "ca.pem",
        server_cert=tmp / "server.pem",
        server_key=tmp / "server.key",
        client_cert=_pem(client),
        client_key=_key_pem(client_key),
        stranger_cert=_pem(stranger),
        stranger_key=_key_pem(stranger_key),
    )


async def _list_sessions(channel: grpc.aio.Channel) -> pb.ListSessionsResponse:
    stub = pb_grpc.ContextServiceStub(channel)
    response: pb.ListSessionsResponse = await stub.ListSessions(pb.ListSessionsRequest(), timeout=TIMEOUT)
    return response


async def _fails_to_connect(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    async with channel:
        error = await rpc_error(_list_sessions(channel))
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), error
    return error


async def test_tls(backend: str, tmp_path: Path, pki: Pki) -> None:
    running = await start(
        settings_for(
            await fresh_database(backend, tmp_path), tls_cert=str(pki.server_cert), tls_key=str(pki.server_key)
        )
    )
    target = f"127.0.0.1:{running.port}"
    trust = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    try:
        # Verified against the IP address SAN, then against the DNS SAN "localhost".
        async with grpc.aio.secure_channel(target, trust) as channel:
            assert isinstance(await _list_sessions(channel), pb.ListSessionsResponse)
            health = health_pb2_grpc.HealthStub(channel)
            checked = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT)
            assert checked.status == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.secure_channel(
            target, trust, options=[("grpc.ssl_target_name_override", "localhost")]
        ) as channel:
            assert isinstance(await _list_sessions(channel), pb.ListSessionsResponse)

        # Plaintext to a TLS port, a client that does not trust the CA, and a name not in the certificate.
        await _fails_to_connect(grpc.aio.insecure_channel(target))
        await _fails_to_connect(grpc.aio.secure_channel(target, grpc.ssl_channel_credentials()))
        await _fails_to_connect(
            grpc.aio.secure_channel(target, trust, options=[("grpc.ssl_target_name_override", "wrong.example")])
        )
    finally:
        await running.stop(grace=1.0)


async def test_mutual_tls(backend: str, tmp_path: Path, pki: Pki) -> None:
    running = await start(
        settings_for(
            await fresh_database(backend, tmp_path),
            tls_cert=str(pki.server_cert),
            tls_key=str(pki.server_key),
            tls_client_ca=str(pki.ca),
        )
    )
    target = f"127.0.0.1:{running.port}"
    ca = pki.ca.read_bytes()
    try:
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=pki.client_key, certificate_chain=pki.client_cert
        )
        async with grpc.aio.secure_channel(target, with_cert) as channel:
            assert isinstance(await _list_sessions(channel), pb.ListSessionsResponse)

        await _fails_to_connect(grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca)))
        stranger = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=pki.stranger_key, certificate_chain=pki.stranger_cert
        )
        await _fails_to_connect(grpc.aio.secure_channel(target, stranger))
        await _fails_to_connect(grpc.aio.insecure_channel(target))
    finally:
        await running.stop(grace=1.0)
