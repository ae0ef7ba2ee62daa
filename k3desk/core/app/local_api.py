"""The local API a person's own tools use: one address that stays put, and named keys.

The app's engine and ``k3desk serve`` listen on one port chosen once (Settings' Local
API, ``k3desk api port``; 8033 unless changed, or ``K3DESK_API_PORT`` for one run), so
the base URL a tool was given stays right across restarts, crash re-plans and model
switches.  Each launch accepts the app's own key (fresh per launch: k3desk's own traffic)
and every client key the person made (:mod:`k3desk.core.engines.client_keys`).

``k3desk serve`` and ``k3desk api serve`` put k3desk's front
(:mod:`k3desk.core.engines.front`) at the address and the engine behind it on loopback: the
address answers while the engine starts, restarts after a crash or is re-planned (503 with
Retry-After, which the SDKs wait for and retry), and no other program can take the port
between two attempts.  The front passes the bytes on (measured in ``bench/front.py``: no
slower than the engine alone).  The app's window does the same with :class:`AppFront`,
one front for the app's process that its launches share: a model switch, a restart or a
re-plan in the window keeps the address answering (503 with Retry-After until the new
engine is ready).  An engine kept running after the window closes keeps its front too:
the process keeping it is the app's, without a window.
A key created or revoked takes effect when the engine next starts (it reads its keys once).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from k3desk.core.app.library import local_models
from k3desk.core.app.tool_conversations import tool_conversations
from k3desk.core.app.tool_settings import ToolSnippet, tool_snippets
from k3desk.core.chat.kept_state import states_dir
from k3desk.core.engines.client_keys import ApiKeyError, ClientKey, ClientKeys, check_name
from k3desk.core.engines.front import Conversations, FrontConfig, RouterFront, Upstream
from k3desk.core.engines.ports import ANY_HOST, LOOPBACK, port_problem
from k3desk.core.engines.router import preset_name
from k3desk.core.engines.supervisor import Endpoint, LaunchSpec
from k3desk.core.errors import EngineError, K3Error
from k3desk.core.gguf.shards import parse_split_name
from k3desk.core.settings import MAX_PARALLEL, ORIGIN, Settings, SettingsError

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.engines.launch import PreparedLaunch

__all__ = [
    "BIND_WAIT",
    "DEFAULT_PORT",
    "KEEP_WAIT",
    "LOOPBACK",
    "MAX_PARALLEL",
    "PORT_ENV",
    "ApiKeyError",
    "AppFront",
    "ClientKey",
    "ClientKeys",
    "Fronted",
    "LocalApi",
    "RouterFront",
    "api_port",
    "behind_a_front",
    "check_name",
    "client_keys",
    "create_key",
    "endpoint_spec",
    "key_secret",
    "lan_addresses",
    "local_api",
    "others_named",
    "port_check",
    "port_problem",
    "revoke_key",
    "set_api_port",
    "set_lan",
    "start_front",
    "tool_settings",
    "with_local_api",
]

DEFAULT_PORT = Settings().api_port
PORT_ENV = "K3DESK_API_PORT"  # a port for this run only (0: a free one each launch)
# seconds a request to `k3desk api serve` waits for the model it names to load before it is
# answered 503 with Retry-After (core/engines/front.py)
LOAD_WAIT = 30.0

PORT_HINT = (
    "Stop that program, or give the local API another port: Settings > Local API, or "
    "`k3desk api port N` (`k3desk serve --port N` for one run)."
)
RESTART_NOTE = (
    "The running engine takes the change when it next starts (Relaunch in the app; restart "
    "`k3desk serve`)."
)


def client_keys(services: Services) -> ClientKeys:
    """The person's client keys (their secrets in the keyring, else a private file)."""
    return ClientKeys(services.paths.config, services.secrets)


def api_port(settings: Settings, env: Mapping[str, str] | None = None) -> int:
    """The port the local API listens on (0: a free one each launch): ``K3DESK_API_PORT``
    when set, else the setting.  A variable that is no port is a :class:`SettingsError`."""
    value = (os.environ if env is None else env).get(PORT_ENV, "").strip()
    if not value:
        return settings.api_port
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise SettingsError(
            f"{PORT_ENV}={value[:40]!r} is not a port.",
            "Set it to a number from 1 to 65535, or 0 for a free port each launch; or unset "
            "it to use the port in Settings.",
        )
    return int(value)


def endpoint_spec(
    services: Services,
    prepared: PreparedLaunch,
    settings: Settings,
    *,
    port: int | None = None,
) -> LaunchSpec:
    """What the supervisor starts for the local API: ``prepared`` on the API's port
    (``port`` when given; 0 = a free one), accepting the app's key and every client key."""
    return with_local_api(services, prepared.spec(), settings, port=port)


def with_local_api(
    services: Services, spec: LaunchSpec, settings: Settings, *, port: int | None = None
) -> LaunchSpec:
    """``spec`` on the local API's port (``port`` when given; 0 = a free one), accepting
    every client key beside the app's own.  Reads the keyring: off a GUI thread."""
    chosen = api_port(settings) if port is None else port
    keys = tuple(secret for _, secret in client_keys(services).active())
    spec = replace(
        spec,
        port=chosen or None,
        client_keys=keys,
        port_hint=PORT_HINT,
        state_dir=states_dir(services.paths.cache) if settings.kept_state_gib else None,
    )
    if not settings.api_lan:
        return spec
    if not spec.local_cors:
        raise EngineError(
            f"{spec.executable} cannot limit which web pages read its answers "
            "(--cors-origins, --no-cors-credentials): reached over the network, a page of "
            "any site could use it.",
            "Use llama.cpp b11434 or later (Engine > Build an engine), or turn off "
            "Settings > Local API > Reachable from other devices.",
        )
    return replace(spec, host=ANY_HOST, cors_origin=settings.api_cors_origin)


@dataclass(frozen=True)
class Fronted:
    """A local API launch with k3desk's front at its address: the engine's own launch (on
    loopback, a free port) and where the front listens for the person's tools."""

    engine: LaunchSpec
    host: str
    port: int  # 0: a free one
    allow_origin: str  # the one web origin whose pages may read the front's own answers


def behind_a_front(spec: LaunchSpec) -> Fronted:
    """``spec`` (from :func:`with_local_api`) moved behind a front at its address."""
    origin = (spec.cors_origin or "localhost") if spec.local_cors else ""
    engine = replace(spec, host=LOOPBACK, port=None, port_hint="")
    return Fronted(engine, spec.host, spec.port or 0, origin)


def others_named(services: Services, shard: Path, *, window: bool = False) -> dict[str, str]:
    """The names a request may give for the person's other models in My models, each with
    why ``k3desk serve`` (the app's window where ``window``) answers it 400: it runs
    ``shard``'s set alone, and llama-server alone answers a request naming any model with
    the one it has, under the name asked for (b11434's tools/server/server-common.cpp:
    ``json_value(request, "model", model_name)``)."""
    try:
        models, _problems = local_models(services)
    except K3Error:
        return {}  # My models unreadable: nothing to say of them, the model still served
    here = shard.resolve()
    split = parse_split_name(here.name)  # any part of the set may be given
    first = here.with_name(split.part(1)) if split is not None else here
    served = [m for m in models if m.shard.resolve() == first]
    runs = served[0].name if served else (split.prefix if split is not None else here.stem)
    mine = {runs, preset_name(runs)}
    why = (
        f"k3desk serve runs {runs} alone. Ask for that one, or serve every model in My "
        "models with `k3desk api serve`, which loads the one a request names."
    )
    if window:
        # the person chose the window's model: a tool's request does not switch it
        why = (
            f"the k3desk window runs {runs}. Ask for that one, or load the other in the "
            "window's Engine page (`k3desk api serve` loads the one a request names)."
        )
    out: dict[str, str] = {}
    for m in models:
        if m.shard.resolve() != first:
            for name in (m.name, preset_name(m.name)):
                if name not in mine:
                    out.setdefault(name, why)
    return out


def start_front(
    fronted: Fronted,
    upstream: Callable[[], Endpoint | None],
    *,
    served: Mapping[str, int] | None = None,
    left_out: Mapping[str, str] | None = None,
    load_wait: float = LOAD_WAIT,
    conversations: Conversations | None = None,
    on_slot: Callable[[], None] | None = None,
) -> RouterFront:
    """The front at ``fronted``'s address before the engine ``upstream()`` names (the
    Supervisor's endpoint: None while it starts or restarts); ``served`` (names and sizes)
    and ``left_out`` (names and why) for a router; ``conversations`` keeps tools'
    conversations in the engine's state (one model, one slot).  Raises
    :class:`EngineError` when the address is taken, naming who holds it."""
    config = FrontConfig(
        host=fronted.host,
        port=fronted.port,
        client_keys=fronted.engine.client_keys,
        left_out=dict(left_out or {}),
        served=dict(served or {}),
        load_wait=load_wait,
        allow_origin=fronted.allow_origin,
        conversations=conversations,
        on_slot=on_slot,
    )

    def engine() -> Upstream | None:
        ep = upstream()
        return None if ep is None else Upstream(LOOPBACK, ep.port, ep.api_key, ep.pid)

    front = RouterFront(config, engine)
    try:
        front.start()
    except OSError as e:
        problem, hint = port_problem(fronted.port, fronted.host)
        said = f"The local API cannot listen at {fronted.host}:{fronted.port}: {e.strerror or e}."
        raise EngineError(problem or said, hint or PORT_HINT) from e
    return front


# how long a launch waits for the address to be free: a process that kept an engine in
# the background holds it with its front until it has stopped that engine and exited
BIND_WAIT = 10.0
# how long a stop, a switch or the window's chat waits for a tool's conversation to be
# kept, and a stop, a switch or the window closing for the chat's
KEEP_WAIT = 10.0


class AppFront:
    """The local API's address in the app's process, held across the launches of its window:
    each launch's engine goes behind it on loopback (:meth:`place`), and between two
    engines (a model switch, a restart, a re-plan, a crash) the address answers 503 with
    Retry-After.  A request naming another of My models is told the window runs another
    (400).

    Tools' conversations are kept as under ``k3desk serve`` (one slot: Settings' requests
    at once 1), ``say`` getting a line for each kept or brought back.  The window's own
    chat shares that slot without the front, so the two tell each other: the chat calls
    :meth:`slot_taken` before its turn (the tool's conversation is kept first, and brought
    back at the tool's next request), and :attr:`on_tool_turn` is called before a tool's
    request that may take the slot (the chat then brings its own back)."""

    def __init__(self, services: Services, say: Callable[[str], None] | None = None) -> None:
        self.services = services
        self.say = say or (lambda _line: None)
        # set by the window's chat: a tool's request is about to take the engine's slot
        self.on_tool_turn: Callable[[], None] = lambda: None
        self._front: RouterFront | None = None
        self._where: tuple[str, int, str] | None = None  # host, port asked, allowed origin
        self._engine: Callable[[], Endpoint | None] = lambda: None
        self._lock = threading.Lock()

    def place(
        self,
        spec: LaunchSpec,
        settings: Settings,
        engine: Callable[[], Endpoint | None],
        *,
        wait: float = 0.0,
    ) -> LaunchSpec:
        """The launch of ``spec`` on the local API: its engine's own spec (loopback, a free
        port), with this process's front at the address (started, or kept with this
        launch's keys and names) before the engine ``engine()`` names.  Reads the keyring:
        off a GUI thread.  Raises :class:`EngineError` naming who holds the address when
        it is taken (still after ``wait`` seconds: :data:`BIND_WAIT` where a process that
        kept an engine in the background was just asked to stop)."""
        fronted = behind_a_front(with_local_api(self.services, spec, settings))
        parts = spec.model_parts
        left = others_named(self.services, parts[0], window=True) if parts else {}
        where = (fronted.host, fronted.port, fronted.allow_origin)
        conv = tool_conversations(self.services, settings, settings.api_parallel, self.say)
        with self._lock:
            self._engine = engine
            front = self._front
            if front is not None and self._where == where:
                front.config = replace(
                    front.config,
                    client_keys=fronted.engine.client_keys,
                    left_out=left,
                    conversations=conv,
                )
                return fronted.engine
            self._stop()
            deadline = time.monotonic() + wait
            while True:
                try:
                    self._front = start_front(
                        fronted,
                        lambda: self._engine(),
                        left_out=left,
                        conversations=conv,
                        on_slot=lambda: self.on_tool_turn(),
                    )
                    break
                except EngineError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            self._where = where
        return fronted.engine

    @property
    def url(self) -> str | None:
        """Where tools reach the local API now (None while no front listens)."""
        front = self._front
        if front is None or self._where is None:
            return None
        host = LOOPBACK if self._where[0] == ANY_HOST else self._where[0]
        return f"http://{host}:{front.port}"

    def stop(self) -> None:
        """Let the address go (the person stopped the engine, or the app exits)."""
        with self._lock:
            self._stop()

    def flush(self, timeout: float = KEEP_WAIT) -> bool:
        """Keep the conversation a tool had answered last now, before its engine stops
        (False when that took more than ``timeout`` seconds)."""
        front = self._front
        return front.flush(timeout) if front is not None else True

    def slot_taken(self, timeout: float = KEEP_WAIT) -> bool:
        """The window's chat is about to take the engine's slot: a tool's conversation
        answered last is kept first, and brought back at its next request."""
        front = self._front
        return front.slot_taken(timeout) if front is not None else True

    def let_go(self, engine: Callable[[], Endpoint | None]) -> bool:
        """Let the address go if the launch that placed ``engine`` is still the last one
        (its engine failed to load, or gave up): a tool is refused a connection at once
        instead of being told to come back for an engine that will not come.  A later
        launch's :meth:`place` keeps the address; True when it was let go."""
        with self._lock:
            if self._front is None or self._engine is not engine:
                return False
            self._stop()
            return True

    def _stop(self) -> None:
        front, self._front, self._where = self._front, None, None
        if front is not None:
            front.stop()


def lan_addresses() -> tuple[str, ...]:
    """This machine's IPv4 addresses other devices may reach (loopback and link-local
    left out): where the local API answers once it is reachable from other devices."""
    out = []
    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return ()
    for addrs in interfaces.values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith(("127.", "169.254.")):
                out.append(a.address)
    return tuple(dict.fromkeys(out))


def set_lan(services: Services, on: bool, cors_origin: str | None = None) -> Settings:
    """Let other devices reach the local API (every IPv4 interface, keys still required),
    or not; ``cors_origin`` (when given) is the one web origin whose pages may read it
    ("" = none beyond this machine).  Counts from the engine's next start."""
    current = services.settings()
    origin = current.api_cors_origin if cors_origin is None else cors_origin.strip()
    if origin and not ORIGIN.fullmatch(origin):
        raise SettingsError(
            f"{origin[:80]!r} is not a web origin.",
            "An origin is what a browser sends: http://host or https://host:port, with no "
            "path (for example http://10.0.0.5:3000); '' allows none.",
        )
    settings = replace(current, api_lan=on, api_cors_origin=origin)
    services.settings_store.save(settings)  # validated: a bad origin is said, nothing saved
    return settings


def port_check(port: int) -> str:
    """Why the local API cannot listen on ``port`` now, naming who holds it ("" when it
    can, or for 0: a free port each launch)."""
    if port == 0:
        return ""
    problem, _hint = port_problem(port)
    return problem


@dataclass(frozen=True)
class LocalApi:
    """The local API as the views show it."""

    port: int  # 0: a free port each launch
    keys: tuple[ClientKey, ...]
    warning: str = ""  # a damaged list of keys set aside, in words
    lan: bool = False  # reachable from other devices
    cors_origin: str = ""
    addresses: tuple[str, ...] = ()  # this machine's addresses others reach (with lan)

    @property
    def lan_urls(self) -> tuple[str, ...]:
        """Where other devices reach it (with ``lan`` and a fixed port)."""
        if not (self.lan and self.port):
            return ()
        return tuple(f"http://{a}:{self.port}/v1" for a in self.addresses)

    @property
    def url(self) -> str:
        """The base URL the OpenAI SDK takes (``""`` while the port changes per launch)."""
        return f"http://{LOOPBACK}:{self.port}/v1" if self.port else ""

    @property
    def where(self) -> str:
        """Where the keys' secrets are kept, in words."""
        places = {k.place for k in self.keys}
        if places == {"file"}:
            return "in a private file (this machine has no keyring)"
        if places == {"keyring"}:
            return "in the system keyring"
        return "in the system keyring and a private file" if places else ""


def local_api(services: Services, settings: Settings) -> LocalApi:
    keys = client_keys(services)
    listed = tuple(keys.listed())
    lan = settings.api_lan
    return LocalApi(
        api_port(settings),
        listed,
        keys.warning,
        lan=lan,
        cors_origin=settings.api_cors_origin,
        addresses=lan_addresses() if lan else (),
    )


def tool_settings(
    services: Services, settings: Settings, name: str = "", *, url: str = ""
) -> tuple[ToolSnippet, ...]:
    """curl and the SDKs set up for the local API with the client key ``name`` (the first
    one when ""), at ``url`` (the API's fixed address when "")."""
    keys = client_keys(services)
    listed = keys.listed()
    if not listed:
        raise ApiKeyError(
            "There is no API key for your tools yet.",
            "Make one with `k3desk api create NAME` (or Settings > Local API > New key).",
        )
    key = keys.find(name) if name else listed[0]
    base = url or f"http://{LOOPBACK}:{api_port(settings)}"
    if not url and not api_port(settings):
        raise ApiKeyError(
            "The local API takes a free port at each launch, so there is no fixed address.",
            "Choose a port with `k3desk api port 8033` (or in Settings > Local API).",
        )
    return tool_snippets(base, keys.secret(key))


def set_api_port(services: Services, port: int) -> tuple[Settings, str]:
    """Keep ``port`` as the local API's (0: a free one each launch); returns the saved
    settings and, when something listens there now, who (it may be k3desk's own engine)."""
    if isinstance(port, bool) or not 0 <= port <= 65535:
        raise SettingsError(
            f"{port} is not a port.",
            "Choose a number from 1024 to 65535 (or 0 for a free port each launch).",
        )
    if 0 < port < 1024:
        raise SettingsError(
            f"Port {port} is privileged: only an administrator's program may listen on it.",
            f"Choose a port from 1024 to 65535 ({DEFAULT_PORT} unless it is taken).",
        )
    settings = replace(services.settings(), api_port=port)
    services.settings_store.save(settings)
    return settings, port_check(port)


def create_key(services: Services, name: str) -> tuple[ClientKey, str]:
    """A new client key named ``name``: (as listed, the secret)."""
    return client_keys(services).create(name)


def revoke_key(services: Services, name: str) -> ClientKey:
    """Forget the client key ``name``."""
    return client_keys(services).revoke(name)


def key_secret(services: Services, name: str) -> str:
    """The client key ``name`` itself, to paste into a tool."""
    keys = client_keys(services)
    return keys.secret(keys.find(name))
