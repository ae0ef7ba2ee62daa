"""``k3desk api``: the local API your own tools use -- its address, and keys that stay."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from k3desk.core.app.local_api import (
    LOAD_WAIT,
    LOOPBACK,
    PORT_HINT,
    RESTART_NOTE,
    ClientKey,
    api_port,
    create_key,
    key_secret,
    local_api,
    port_problem,
    revoke_key,
    set_api_port,
    set_lan,
    tool_settings,
)
from k3desk.core.app.values import EngineError

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "api",
        help="the local API for your own tools: address, keys, settings to paste",
        description="k3desk's engine answers the OpenAI API (chat completions, responses, "
        "models) and Anthropic's Messages API at one address that stays the same across "
        "launches (http://127.0.0.1:PORT/v1).  Tools use keys you name here; each is kept in "
        "the system keyring (else a private file) and stays valid until you revoke it.  "
        "Without an action: the address and the keys.",
    )
    p.set_defaults(handler=run_show)
    asub = p.add_subparsers(dest="api_command", metavar="ACTION")

    ls = asub.add_parser("keys", help="list the keys (names and last characters only)")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    ls.set_defaults(handler=run_keys)

    c = asub.add_parser("create", help="make a key for a tool and print it")
    c.add_argument("name", help="what the key is for (e.g. vscode, my-agent)")
    c.set_defaults(handler=run_create)

    k = asub.add_parser("key", help="print a key, to paste into a tool")
    k.add_argument("name")
    k.set_defaults(handler=run_key)

    r = asub.add_parser("revoke", help="forget a key: tools using it are refused")
    r.add_argument("name")
    r.set_defaults(handler=run_revoke)

    pt = asub.add_parser("port", help="show or set the port (0: a free one each launch)")
    pt.add_argument("port", nargs="?", type=int, help="the new port (default 8033)")
    pt.set_defaults(handler=run_port)

    lan = asub.add_parser(
        "lan",
        help="let other devices on your networks reach the API (on), or not (off)",
        description="With on, the engine listens on every IPv4 interface of this machine "
        "from its next start: any device that can reach this machine and holds a key can "
        "use Kimi-K3.  Keys are always required.  Web pages may read answers only from "
        "the one origin given with --cors-origin.",
    )
    lan.add_argument("state", choices=("on", "off"))
    lan.add_argument(
        "--cors-origin",
        metavar="URL",
        help="the one web origin whose pages may read answers (e.g. http://10.0.0.5:3000); "
        "'' for none",
    )
    lan.set_defaults(handler=run_lan)

    st = asub.add_parser(
        "settings", help="print the settings for curl, the OpenAI SDK and the Anthropic SDK"
    )
    st.add_argument("--key", default="", metavar="NAME", help="with this key (default: first)")
    st.set_defaults(handler=run_settings)

    _register_serve(asub)


def _register_serve(asub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sv = asub.add_parser(
        "serve",
        help="serve every model in My models, each loaded when a request names it",
        description="Plan each model in My models for this machine and start llama-server "
        "as a router at the local API's address: /v1/models lists them, and a request "
        'naming one (its "model") loads it with its plan, unloading the model loaded '
        "before (one at a time).  A model that would stream its weights from disk is left "
        "out (serve it alone with `k3desk serve --accept-slow`).  Ctrl-C stops it.",
    )
    sv.add_argument("--port", type=int, help="port for this run (default: the local API's)")
    sv.add_argument(
        "--parallel", type=int, metavar="N", help="requests answered at once, per model"
    )
    sv.add_argument(
        "--max-restarts", type=int, default=3, help="failed attempts in a row before giving up"
    )
    sv.add_argument(
        "--load-wait",
        type=float,
        default=LOAD_WAIT,
        metavar="SECONDS",
        help="how long a request waits for its model to load before it is answered 503 with "
        f"Retry-After (the load goes on; default {LOAD_WAIT:.0f})",
    )
    sv.set_defaults(handler=run_serve)


def run_show(args: argparse.Namespace, services: Services) -> int:
    api = local_api(services, services.settings())
    if api.warning:
        print(f"Warning: {api.warning}")
    if api.url:
        print(f"Address: {api.url}  (Anthropic SDK: {api.url.removesuffix('/v1')})")
    else:
        print("Address: a free port at each launch (`k3desk api port 8033` fixes one)")
    if api.lan:
        print("Reachable from other devices at: " + (", ".join(api.lan_urls) or "(none now)"))
        print(f"Web origin allowed to read answers: {api.cors_origin or 'none'}")
    else:
        print("Reachable from this machine only (`k3desk api lan on` opens it to others).")
    if not api.keys:
        print("Keys: none yet.  `k3desk api create NAME` makes one for a tool.")
        return 0
    print(f"Keys ({len(api.keys)}, kept {api.where}):")
    _print_keys(api.keys)
    print("`k3desk api settings` prints what to paste into curl and the SDKs.")
    return 0


def _print_keys(keys: tuple[ClientKey, ...]) -> None:
    for key in keys:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(key.created))
        print(f"  {key.name:<24} {key.shown}  made {created}")


def run_keys(args: argparse.Namespace, services: Services) -> int:
    api = local_api(services, services.settings())
    if args.json:
        rows = [
            {"name": k.name, "shown": k.shown, "created": k.created, "kept": k.place}
            for k in api.keys
        ]
        print(json.dumps(rows, indent=2))
        return 0
    if api.warning:
        print(f"Warning: {api.warning}")
    if not api.keys:
        print("No keys yet.  `k3desk api create NAME` makes one for a tool.")
        return 0
    _print_keys(api.keys)
    return 0


def run_create(args: argparse.Namespace, services: Services) -> int:
    key, secret = create_key(services, args.name)
    where = "the system keyring" if key.place == "keyring" else "a private file (no keyring here)"
    print(secret)
    print(f"Made key {key.name!r}, kept in {where}.  {RESTART_NOTE}")
    return 0


def run_key(args: argparse.Namespace, services: Services) -> int:
    print(key_secret(services, args.name))
    return 0


def run_revoke(args: argparse.Namespace, services: Services) -> int:
    key = revoke_key(services, args.name)
    print(f"Revoked key {key.name!r} ({key.shown}).  {RESTART_NOTE}")
    return 0


def run_port(args: argparse.Namespace, services: Services) -> int:
    if args.port is None:
        api = local_api(services, services.settings())
        print(api.port if api.port else "0 (a free port at each launch)")
        return 0
    settings, taken = set_api_port(services, args.port)
    shown = settings.api_port or "a free one at each launch"
    print(f"The local API's port is now {shown}.  {RESTART_NOTE}")
    if taken:
        print(f"Note: {taken}")
    return 0


def run_lan(args: argparse.Namespace, services: Services) -> int:
    settings = set_lan(services, args.state == "on", args.cors_origin)
    api = local_api(services, settings)
    if not api.lan:
        print(f"The local API answers on this machine only (127.0.0.1).  {RESTART_NOTE}")
        return 0
    print(
        "Warning: the local API will be reachable from other devices: anyone who can reach "
        "this machine and holds one of your keys can use Kimi-K3 on it."
    )
    for url in api.lan_urls or ("(this machine has no network address now)",):
        print(f"  {url}")
    origin = api.cors_origin or "none (pages of this machine only)"
    print(f"Web origin allowed to read answers: {origin}.  {RESTART_NOTE}")
    return 0


def run_settings(args: argparse.Namespace, services: Services) -> int:
    for snippet in tool_settings(services, services.settings(), args.key):
        print(f"--- {snippet.label}")
        print(snippet.text, end="")
    print("---")
    return 0


def run_serve(args: argparse.Namespace, services: Services) -> int:
    from k3desk.cli.serve import _EventPrinter, _foreground, check_parallel
    from k3desk.core.app.engines import RestartPolicy, Supervisor
    from k3desk.core.app.on_demand import on_demand, start_front

    settings = services.settings()
    parallel = check_parallel(settings.api_parallel if args.parallel is None else args.parallel)
    port = api_port(settings) if args.port is None else args.port
    if port:
        problem, hint = port_problem(port)
        if problem:
            raise EngineError(problem, hint if args.port is not None else PORT_HINT)
    served = on_demand(
        services, settings, port=port, parallel=parallel, say=lambda s: print(s, flush=True)
    )
    print("Models a request may name (loaded when one does, one at a time):")
    for m in served.served:
        print(f"  {m.name}  ({m.size}) {m.plan}")
    for out in served.left_out:
        print(f"Left out: {out.name}: {out.why}")
    print(f"Engine: {served.spec.executable}")
    print(f"Model list: {served.preset}")
    if not 0 <= args.load_wait <= 3600:
        raise EngineError(
            f"--load-wait {args.load_wait:g} is out of range.", "Give 0 to 3600 seconds."
        )
    printer = _EventPrinter()
    sup = Supervisor(
        served.spec,
        services.paths,
        policy=RestartPolicy(max_failures=max(1, args.max_restarts)),
        on_event=printer,
    )
    front = start_front(served, lambda: sup.endpoint, load_wait=args.load_wait)
    printer.address = f"http://{LOOPBACK}:{front.port}"
    try:
        return _foreground(
            sup,
            services=services,
            address=lambda ep: replace(ep, port=front.port),
        )
    finally:
        front.stop()
