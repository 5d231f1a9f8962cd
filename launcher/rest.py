"""``tether serve``: the launcher's private REST interface (aiohttp, an optional extra: ``pip install
tether[rest]``; nothing else in tether imports it).

On a unix socket by default (``launcher.socket``, mode 0660, in a directory only the service
account -- or root -- may write: the directory's and the socket's permissions decide who may
connect, and nobody else can take the socket's name while the service is down), or on loopback TCP
with a bearer token and TLS (``--tls-cert``/``--tls-key``): plain TCP is refused, since a user who
binds the port while the service is down would receive the clients' tokens; a client that
verifies the certificate never sends its token to anyone but the service. JSON in, JSON out; every
refusal is a 4xx with ``{"error": ...}`` and writes nothing. A body over
``launcher.max_request_bytes`` is refused (413) before it is read, and at most
``launcher.max_requests`` requests are handled at once (the next: 503 with Retry-After), so the
bodies held are bounded. The blocking work (sudo, sbatch) runs in worker threads, so one slow
submission does not hold up a status query. The start and each refused request are one line on
stderr.

The routes are described by ``OPENAPI`` (served at ``/openapi.json``); a test holds the two equal.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import ssl
import stat
import sys
from typing import Any, Callable

from ..hooks.config import Config
from .service import Launcher, LauncherError

RETRY_AFTER = 1               # seconds a client told 503 waits before it tries again


class InFlight:
    """The requests in hand (``now``) and the most at once (``most``)."""

    def __init__(self) -> None:
        self.now = self.most = 0


try:                          # aiohttp is the rest extra: only serve() needs it
    from aiohttp.web import AppKey

    IN_FLIGHT: Any = AppKey("tether_in_flight", InFlight)
except ImportError:           # pragma: no cover
    IN_FLIGHT = "tether_in_flight"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} bytes"


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` for a log line: one line, printable, bounded (it may carry a client's bytes)."""
    flat = "; ".join(part for part in str(text).splitlines() if part)
    flat = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in flat)
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _log(line: str) -> None:
    print(f"tether: {line}", file=sys.stderr, flush=True)

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_RECORD = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}}


def _op(summary: str, ok: str, *, body: bool = False, job: bool = True, status: str = "200") -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {status: {"description": ok, **_RECORD},
                                                           "400": {"description": "bad request", **_ERROR},
                                                           "403": {"description": "not allowed", **_ERROR},
                                                           "503": {"description": "busy: try again after "
                                                                                  "Retry-After", **_ERROR}}}
    if job:
        op["parameters"] = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
        op["responses"]["404"] = {"description": "no such job", **_ERROR}
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/JobSpec"}}}}
        op["responses"]["413"] = {"description": "body too large", **_ERROR}
    return op


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "tether launcher", "version": "1",
             "description": "Submit and manage Slurm/PBS jobs on behalf of users."},
    "paths": {
        "/v1/health": {"get": _op("the service's own checks", "health", job=False)},
        "/v1/jobs": {"get": _op("every job with a record", "the records", job=False),
                     "post": _op("submit a job spec as its user", "submitted", body=True, job=False, status="201")},
        "/v1/jobs/{id}": {"get": _op("a job's state", "the record"),
                          "delete": _op("remove a job's tree and record (cancelled first if needed)", "removed")},
        "/v1/jobs/{id}/logs": {"get": _op("the job's logs, and the startup-failure excerpt", "the logs")},
        "/v1/jobs/{id}/cancel": {"post": _op("cancel the job as its user", "the record")},
        "/openapi.json": {"get": {"summary": "this document", "responses": {"200": {"description": "OpenAPI"}}}},
    },
    "components": {"schemas": {
        "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
        "Job": {"type": "object", "properties": {
            "id": {"type": "string"}, "user": {"type": "string"}, "job_id": {"type": "string", "nullable": True},
            "state": {"type": "string", "enum": ["PREPARING", "PENDING", "RUNNING", "COMPLETED", "FAILED",
                                                 "CANCELLED", "TIMEOUT", "UNKNOWN"]},
            "exit_code": {"type": "integer", "nullable": True}, "job_name": {"type": "string"},
            "startup_failure": {"type": "string"}}},
        "JobSpec": {"type": "object", "description": "a launcher job spec (see tether.launcher.jobspec)",
                    "required": ["user", "command"], "properties": {
                        "user": {"type": "string"}, "command": {"type": "array", "items": {"type": "string"}},
                        "job_type": {"type": "string"}, "slots_per_trial": {"type": "integer"},
                        "slot_type": {"type": "string"}, "resource_pool": {"type": "string"},
                        "image": {"type": "string"}, "runtime": {"type": "string"},
                        "container": {"type": "object"}, "environment": {"type": "object"},
                        "files": {"type": "object"}, "slurm": {"type": "object"}, "pbs": {"type": "object"}}},
    }},
}


def make_app(launcher: Launcher, *, token: str | None = None, log: Callable[[str], None] = _log):
    """The aiohttp application over ``launcher`` (``token``: required as ``Authorization: Bearer``);
    ``log`` gets one line per refused request."""
    from aiohttp import web

    settings = launcher.config.data["launcher"]
    max_body: int = settings["max_request_bytes"]
    max_requests: int = settings["max_requests"]
    too_large = (f"the body is larger than {_size(max_body)} (launcher.max_request_bytes): a job spec's staged "
                 f"files are for small inputs; put larger ones where the job can read them")
    in_flight = InFlight()

    def error(status: int, message: str, **headers: str):
        return web.json_response({"error": message}, status=status, headers=headers or None)

    async def answer(request, handler):
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return error(401, "a bearer token is required")
        if in_flight.now >= max_requests:         # before its body is read: nothing of it is held
            return error(503, f"the launcher is busy ({max_requests} requests at once, launcher.max_requests): "
                              f"try again in {RETRY_AFTER} s", **{"Retry-After": str(RETRY_AFTER)})
        if request.content_length is not None and request.content_length > max_body:
            return error(413, too_large)          # said by its length: refused before a byte is read
        in_flight.now += 1
        in_flight.most = max(in_flight.most, in_flight.now)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:     # no length said: cut off at the limit while read
            return error(413, too_large)
        except web.HTTPException as exc:
            return error(exc.status, exc.reason)
        except LauncherError as exc:
            return error(exc.status, str(exc))
        except Exception as exc:                  # never a bare 500 page: say what, log the rest
            import traceback

            traceback.print_exc(file=sys.stderr)
            return error(500, f"internal error in the launcher ({type(exc).__name__}: {exc})")
        finally:
            in_flight.now -= 1

    @web.middleware
    async def guard(request, handler):
        response = await answer(request, handler)
        if response.status >= 400:
            try:
                said = json.loads(response.body)["error"]
            except (TypeError, ValueError, KeyError):
                said = response.reason
            word = "failed" if response.status >= 500 and response.status != 503 else "refused"
            log(f"{word} {request.method} {_one_line(request.raw_path, 120)}: {response.status} {_one_line(said)}")
        return response

    async def blocking(func: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(None, func, *args)

    async def submit(request):
        if request.content_type != "application/json":
            return error(415, "send the job spec as application/json")
        try:
            data = json.loads(await request.read())
        except ValueError as exc:
            return error(400, f"malformed JSON: {exc}")
        if not isinstance(data, dict):
            return error(400, "the job spec must be a JSON object")
        return web.json_response(await blocking(launcher.submit, data), status=201)

    def job_route(method: Callable):
        async def handle(request):
            return web.json_response(await blocking(method, request.match_info["id"]))
        return handle

    async def jobs(request):
        return web.json_response(await blocking(launcher.list))

    async def health(request):
        return web.json_response(await blocking(launcher.health))

    async def openapi(request):
        return web.json_response(OPENAPI)

    app = web.Application(middlewares=[guard], client_max_size=max_body)
    app[IN_FLIGHT] = in_flight
    app.router.add_get("/v1/health", health, allow_head=False)
    app.router.add_get("/v1/jobs", jobs, allow_head=False)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs/{id}", job_route(launcher.status), allow_head=False)
    app.router.add_delete("/v1/jobs/{id}", job_route(launcher.cleanup))
    app.router.add_get("/v1/jobs/{id}/logs", job_route(launcher.logs), allow_head=False)
    app.router.add_post("/v1/jobs/{id}/cancel", job_route(launcher.cancel))
    app.router.add_get("/openapi.json", openapi, allow_head=False)
    return app


def _secret_mode(what: str, path: str, st: os.stat_result) -> str | None:
    """Why the file holding a secret (the token, the TLS key) is too open, or None: it must be the
    service account's with mode 600 or less, or root's with 640 or less (as PostgreSQL asks of its key)."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == os.geteuid() and not mode & 0o077 or st.st_uid == 0 and not mode & 0o037:
        return None
    if st.st_uid not in (0, os.geteuid()):
        return f"{what} {path} belongs to uid {st.st_uid}: make it the service account's (mode 600) or root's (640)"
    return f"{what} {path} is readable by others (mode {mode:o}): chmod 600 it (root's: 640 at most)"


def _socket_dir(path: str) -> str | None:
    """Why the socket's directory is not one only the service (or root) controls, or None."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"the socket's directory {path} is not a directory"
    if st.st_uid not in (0, os.geteuid()) or stat.S_IMODE(st.st_mode) & 0o022:
        return (f"the socket's directory {path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) may be "
                f"written by others, who could take the socket's name while the service is down: use a directory "
                f"of the service account's (or root's) that only it may write, e.g. mode 750")
    return None


def serve(config: Config, *, socket_path: str | None = None, tcp: str | None = None, token_file: str | None = None,
          tls_cert: str | None = None, tls_key: str | None = None) -> int:
    """Run until SIGINT/SIGTERM. Every argument is checked (and the token and certificate read)
    before anything listens: a mistake is a one-line error and exit 2, never a traceback."""
    try:
        from aiohttp import web
    except ImportError:
        print("tether: tether serve needs aiohttp: pip install 'tether[rest]'", file=sys.stderr)
        return 1

    def usage(message: str) -> int:
        print(f"tether: {message}", file=sys.stderr)
        return 2
    token = context = None
    host = port = ""
    if tcp:
        host, _, port = tcp.rpartition(":")
        if host not in ("127.0.0.1", "::1", "[::1]", "localhost") or not port.isdigit():
            return usage("--tcp takes a loopback address, 127.0.0.1:PORT (the interface is private)")
        if not token_file:
            return usage("--tcp needs --token-file (the bearer token every request must carry)")
        if tls_key and not tls_cert:
            return usage("--tls-key needs --tls-cert")
        if not tls_cert:
            return usage("--tcp needs --tls-cert (and --tls-key): a client sends its token only to the service "
                         "whose certificate it verifies, never to whoever holds the port; or use the unix socket "
                         "(launcher.socket)")
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
                too_open = _secret_mode("the token file", token_file, os.fstat(fh.fileno()))
        except (OSError, UnicodeDecodeError) as exc:
            return usage(f"cannot read the token file {token_file}: {getattr(exc, 'strerror', None) or exc}")
        if len(token) < 16:
            return usage("the token must be at least 16 characters")
        if too_open:
            return usage(too_open)
    elif tls_cert or tls_key or token_file:
        return usage("--token-file, --tls-cert and --tls-key go with --tcp (the unix socket is guarded by its "
                     "group instead)")
    if tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(tls_cert, tls_key)
            key = tls_key or tls_cert
            too_open = _secret_mode("the TLS key", key, os.stat(key))
        except (OSError, ssl.SSLError) as exc:
            return usage(f"cannot load the TLS certificate {tls_cert}" + (f" and key {tls_key}" if tls_key else "")
                         + f": {getattr(exc, 'strerror', None) or exc}")
        if too_open:
            return usage(too_open)
    try:
        launcher = Launcher(config)
    except LauncherError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    app = make_app(launcher, token=token)
    if tcp:
        import socket

        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # past TIME_WAIT; never a listening port
        try:
            sock.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            sock.close()
            print(f"tether: cannot listen on {tcp}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        _log(f"serving the launcher on https://{tcp} (a bearer token, TLS)")
        web.run_app(app, sock=sock, ssl_context=context, print=None)
        return 0
    import socket

    path = socket_path or config.data["launcher"]["socket"]
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o750, exist_ok=True)
        unsafe = _socket_dir(directory)
    except OSError as exc:
        print(f"tether: cannot make the socket's directory {directory}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if unsafe:
        return usage(unsafe)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)                      # a previous service's
        else:
            return usage(f"{path} exists and is not a socket: remove it or choose another launcher.socket")
    except FileNotFoundError:
        pass
    except OSError as exc:
        print(f"tether: cannot replace the socket {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)                    # the socket is made 0660 (only it: not the records)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        print(f"tether: cannot listen on {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        os.umask(old)
    _log(f"serving the launcher on {path} (a unix socket, mode 660)")
    web.run_app(app, sock=sock, print=None)
    return 0
