"""Every model a person has at the local API, loaded when a request names it.

Each model in My models is planned as a launch of its own would be (this machine, the
local API's requests-at-once, the settings ``k3desk tune`` kept); those whose plan runs
from memory go into llama-server's router (:mod:`k3desk.core.engines.router`) under the
name a request gives.  A plan that streams its weights from disk is never loaded by a
request: it costs seconds per token and minutes of loading, which the person accepts for
one launch (``k3desk serve --accept-slow``), so it is left out and said, as is any model
that cannot be planned.  The router itself runs under the :class:`Supervisor`, at the
local API's port with the person's keys, like any launch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.launch import LocalLaunchRequest, SlowLaunchError, prepare_local_launch
from k3desk.core.app.library import local_models
from k3desk.core.app.local_api import Fronted, behind_a_front, with_local_api
from k3desk.core.app.local_api import start_front as start_local_front
from k3desk.core.engines.front import RouterFront
from k3desk.core.engines.ports import LOOPBACK
from k3desk.core.engines.router import PresetModel, preset_name, preset_text, router_args
from k3desk.core.engines.supervisor import Endpoint, LaunchSpec
from k3desk.core.errors import EngineError, K3Error
from k3desk.core.private import write_private
from k3desk.core.settings import Settings
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

# seconds for the router itself to answer /health: it loads no model at start
ROUTER_READY_SECONDS = 60.0


@dataclass(frozen=True)
class Served:
    """A model a request may name, and how it will run when it does."""

    name: str  # the request's "model"
    shard: Path
    size: str
    plan: str  # the plan's reason, as k3desk plan says it
    size_bytes: int = 0


@dataclass(frozen=True)
class LeftOut:
    name: str
    why: str


@dataclass(frozen=True)
class OnDemand:
    spec: LaunchSpec  # the router's own: on loopback, a free port (the front is before it)
    served: tuple[Served, ...]
    left_out: tuple[LeftOut, ...]
    preset: Path  # the router's model list (private), rewritten at each start
    host: str = LOOPBACK  # where tools reach the local API (the front listens there)
    port: int = 0  # 0: a free one
    allow_origin: str = ""  # the one web origin whose pages may read answers


def preset_path(services: Services) -> Path:
    return services.paths.state / "router" / "models.ini"


def on_demand(
    services: Services,
    settings: Settings,
    *,
    port: int | None = None,
    parallel: int | None = None,
    say: Callable[[str], None] | None = None,
) -> OnDemand:
    """Plan every usable model in My models and make the router's launch for those that
    run from memory here.  Raises :class:`EngineError` when none does."""
    models, _problems = local_models(services)
    served: list[Served] = []
    left: list[LeftOut] = []
    presets: list[PresetModel] = []
    engine: Path | None = None
    first: LaunchSpec | None = None
    for model in models:
        name = preset_name(model.name)
        if not model.ok:
            left.append(LeftOut(model.name, model.problem))
            continue
        if any(p.name == name for p in presets):
            left.append(LeftOut(model.name, f"another set is already served as {name}"))
            continue
        if say is not None:
            say(f"Planning {model.name} ...")
        try:
            launch = prepare_local_launch(
                services,
                LocalLaunchRequest(
                    model.shard,
                    mmproj=model.projector,
                    configured_engine=services.configured_engine(),
                    parallel=parallel or settings.api_parallel,
                ),
            )
        except SlowLaunchError as e:
            left.append(
                LeftOut(
                    model.name,
                    f"{e.message} Serve it alone: k3desk serve --accept-slow {model.shard}",
                )
            )
            continue
        except K3Error as e:
            left.append(LeftOut(model.name, e.message))
            continue
        spec = launch.prepared.spec()
        if engine is not None and launch.prepared.engine != engine:
            left.append(LeftOut(model.name, f"needs another engine ({launch.prepared.engine})"))
            continue
        engine, first = launch.prepared.engine, first or spec
        presets.append(PresetModel(name, spec.args))
        size = model.size_bytes
        served.append(Served(name, model.shard, fmt_bytes(size), launch.plan.reason, size))
    if first is None or engine is None:
        raise EngineError(
            "No model in My models runs from memory on this machine, so none can be loaded "
            "on request.",
            "; ".join(f"{m.name}: {m.why}" for m in left)
            or "Add a model (k3desk models add PATH) or download a tier (k3desk download).",
        )
    path = preset_path(services)
    write_private(path, preset_text(presets))
    spec = LaunchSpec(
        engine,
        router_args(str(path)),
        ready_timeout=ROUTER_READY_SECONDS,
        api_key_file=first.api_key_file,
        local_cors=first.local_cors,
    )
    return _behind_a_front(
        with_local_api(services, spec, settings, port=port), tuple(served), tuple(left), path
    )


def _behind_a_front(
    spec: LaunchSpec, served: tuple[Served, ...], left: tuple[LeftOut, ...], path: Path
) -> OnDemand:
    """The router on loopback at a port of its own; the front takes the local API's
    address (core/engines/front.py says what it does that the router cannot)."""
    f = behind_a_front(spec)
    return OnDemand(f.engine, served, left, path, f.host, f.port, f.allow_origin)


def start_front(
    served: OnDemand, upstream: Callable[[], Endpoint | None], *, load_wait: float
) -> RouterFront:
    """The local API's front at ``served``'s address before the router ``upstream()``
    names (the Supervisor's endpoint: None while it starts or restarts).  Raises
    :class:`EngineError` when the address is taken, naming who holds it."""
    left: dict[str, str] = {}
    for out in served.left_out:
        left[out.name] = out.why
        left.setdefault(preset_name(out.name), out.why)
    return start_local_front(
        Fronted(served.spec, served.host, served.port, served.allow_origin),
        upstream,
        served={m.name: m.size_bytes for m in served.served},
        left_out=left,
        load_wait=load_wait,
    )
