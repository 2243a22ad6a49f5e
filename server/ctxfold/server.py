"""Assembles the service (store, use cases, servicer, health, reflection) and runs it."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.exc import SQLAlchemyError

from ctxfold import __version__, cpu, loop_lag, memory
from ctxfold.api.admission import Admission
from ctxfold.api.auth import load_tokens
from ctxfold.api.pacing import RequestPacer
from ctxfold.api.servicer import SERVICE, ContextServicer, add_to_server
from ctxfold.config import Settings
from ctxfold.engine import estimator
from ctxfold.engine.errors import ConfigError
from ctxfold.engine.transcript import AppendLimits
from ctxfold.service.contexts import Contexts
from ctxfold.service.maintenance import Maintenance
from ctxfold.service.reads import Reads
from ctxfold.service.run import Hooks
from ctxfold.service.sessions import Sessions
from ctxfold.service.states import ContextStates
from ctxfold.store import Store
from ctxfold.store.database import SchemaError, create_engine, migrate
from ctxfold.summarizers.registry import build_summarizers

if TYPE_CHECKING:
    from ctxfold.gateway.settings import GatewaySettings

log = logging.getLogger("ctxfold")
T = TypeVar("T")


class StartupError(Exception):
    """The server cannot start although its settings are well-formed (the database is unreachable)."""


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    store: Store
    port: int
    settings: Settings
    contexts: Contexts
    maintenance: Maintenance
    admission: Admission

    async def stop(self, grace: float | None = None) -> None:
        """Health turns NOT_SERVING first so balancers drain; new calls are refused and in-flight calls
        get `grace` seconds, then answer SERVER_SHUTTING_DOWN (`Admission.drain`)."""
        await self.health.enter_graceful_shutdown()
        await self.admission.drain(self.settings.grace_seconds if grace is None else grace)
        # Only health and reflection calls may still run: they end at once.
        await self.server.stop(1.0)
        await self.maintenance.background.close()
        await self.store.close()


def _listens_beyond_loopback(listen: str) -> bool:
    host = listen.rsplit(":", 1)[0].strip("[]")
    try:
        return host != "localhost" and not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or none (every interface)
        return True


def _from_file(setting: str, path: str, read: Callable[[Path], T]) -> T:
    """`read(path)`; a file a setting names that cannot be read or parsed is a ConfigError."""
    try:
        return read(Path(path))
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}") from None


def _credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert:
        return None
    ca = _from_file("tls_client_ca", settings.tls_client_ca, Path.read_bytes) if settings.tls_client_ca else None
    key = _from_file("tls_key", settings.tls_key, Path.read_bytes)
    chain = _from_file("tls_cert", settings.tls_cert, Path.read_bytes)
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=ca is not None)


async def _open_store(settings: Settings) -> Store:
    """The store on the migrated database; StartupError (one line) when it cannot be opened."""
    try:
        engine = create_engine(settings.database_url(), pool_size=settings.db_pool_size)
    except OSError as exc:  # the SQLite file's directory cannot be made (a data_dir where none can be)
        raise StartupError(f"database: cannot create the directory of {settings.database_url()}: {exc}") from None
    try:
        await migrate(engine)
    except (SchemaError, OSError, SQLAlchemyError) as exc:
        await engine.dispose()
        url = engine.url.render_as_string(hide_password=True)
        if isinstance(exc, SchemaError):
            raise StartupError(f"database: {url}: {exc}") from None
        raise StartupError(f"database: cannot open {url}: {getattr(exc, 'orig', None) or exc}") from None
    return Store(engine)


def _servicer(settings: Settings, store: Store, tokens: dict[str, str] | None, hooks: Hooks | None) -> ContextServicer:
    """The use cases and the servicer over them, wired once."""
    summarizers = build_summarizers(settings.summarizers)
    limits = AppendLimits(settings.max_message_bytes, settings.max_tool_result_bytes)
    contexts = Contexts(store, limits, settings.hot_state_max_bytes)
    states = ContextStates(contexts)
    maintenance = Maintenance(
        states,
        summarizers,
        hooks=hooks,
        max_waiting_per_session=settings.max_waiting_per_session,
        max_response_bytes=settings.max_send_message_bytes,
    )
    sessions = Sessions(states, frozenset(summarizers), on_rewound=maintenance.background.rewound)
    admission = Admission(
        settings.max_concurrent_rpcs, settings.max_concurrent_rpcs_per_tenant, settings.max_concurrent_request_bytes
    )
    return ContextServicer(
        tokens=tokens,
        sessions=sessions,
        contexts=contexts,
        reads=Reads(store, settings.max_send_message_bytes),
        maintenance=maintenance,
        states=states,
        admission=admission,
        requests=RequestPacer(settings.max_receive_message_bytes),
    )


def _grpc_server(settings: Settings, servicer: ContextServicer) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """ContextService, health and reflection on one gRPC server. No maximum_concurrent_rpcs (gRPC would count health
    checks): `Admission` admits ContextService calls."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
            ("grpc.max_send_message_length", settings.max_send_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    add_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE.full_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    return server, health_servicer


async def start(settings: Settings, hooks: Hooks | None = None) -> RunningServer:
    """Raises ConfigError, before touching the database, when a file named by a setting is unusable."""
    path = settings.auth_tokens_file
    tokens = _from_file("auth_tokens_file", path, load_tokens) if path else None
    credentials = _credentials(settings)
    if tokens is None and _listens_beyond_loopback(settings.listen):
        log.warning(
            "listening on %s without authentication: every caller shares one tenant; "
            "set auth_tokens_file to require bearer tokens",
            settings.listen,
        )
    store = await _open_store(settings)
    # Loaded now, off the loop (on the first count it stalls the loop ~0.5 s), and the counting process started.
    await asyncio.to_thread(estimator.warm_up)
    await asyncio.to_thread(cpu.start_counting)
    servicer = _servicer(settings, store, tokens, hooks)
    server, health_servicer = _grpc_server(settings, servicer)
    try:
        if credentials is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, credentials)
    except RuntimeError as exc:  # grpc raises it when the address cannot be bound
        await store.engine.dispose()
        # grpc's own text only says to raise GRPC_VERBOSITY; the causes are these two.
        raise ConfigError(
            f"listen: cannot listen on {settings.listen}: the port is in use or the host is not this machine's"
        ) from exc
    await server.start()
    for name in ("", SERVICE.full_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "ctxfold %s serving on %s:%d (%s, %s, store %s)",
        __version__,
        settings.listen.rsplit(":", 1)[0] or "0.0.0.0",
        port,
        "TLS" if credentials else "plaintext",
        "bearer tokens" if tokens else "single tenant",
        store.engine.url.render_as_string(hide_password=True),
    )
    return RunningServer(
        server, health_servicer, store, port, settings, servicer.contexts, servicer.maintenance, servicer.admission
    )


async def serve(settings: Settings, gateway: GatewaySettings | None = None) -> None:
    """Serves until SIGTERM or SIGINT; with `gateway`, the HTTP gateway too, as a client of this
    server on loopback (its `server` address is this server's port)."""
    if settings.retained_heap_bytes > 0:
        memory.retain_large_buffers(settings.retained_heap_bytes)
    running = await start(settings)
    embedded = None
    if gateway is not None:
        from ctxfold.gateway.app import listen_address, start_gateway

        try:
            embedded = await start_gateway(dataclasses.replace(gateway, server=f"127.0.0.1:{running.port}"))
        except OSError as exc:
            await running.stop(grace=0)
            raise ConfigError(f"gateway_listen: cannot listen on {gateway.listen}: {exc.strerror}") from None
        log.info("ctxfold gateway serving on %s", listen_address(gateway.listen, embedded.port))
    memory.tune_collector()
    watching = asyncio.create_task(loop_lag.watch(lambda: running.admission.calls))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    watching.cancel()
    log.info("shutting down: draining for up to %.0fs", settings.grace_seconds)
    if embedded is not None:
        await embedded.stop()
    await running.stop()
    log.info("stopped")
