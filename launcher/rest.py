"""``tether serve``: the launcher's private REST interface (aiohttp, an optional extra: ``pip install
tether[rest]``; nothing else in tether imports it).

On a unix socket by default (``launcher.socket``, mode 0660: the directory's and the socket's
permissions decide who may connect), or on loopback TCP with a bearer token (and TLS with
``--tls-cert``/``--tls-key``). JSON in, JSON out; every refusal is a 4xx with ``{"error": ...}``
and writes nothing. The blocking work (sudo, sbatch) runs in worker threads, so one slow
submission does not hold up a status query.

The routes are described by ``OPENAPI`` (served at ``/openapi.json``); a test holds the two equal.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import ssl
import sys
from typing import Any, Callable

from ..hooks.config import Config
from .service import Launcher, LauncherError

MAX_BODY = 32 << 20           # a spec with its staged files (16 MiB of files, JSON-escaped)

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_RECORD = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}}


def _op(summary: str, ok: str, *, body: bool = False, job: bool = True, status: str = "200") -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {status: {"description": ok, **_RECORD},
                                                           "400": {"description": "bad request", **_ERROR},
                                                           "403": {"description": "not allowed", **_ERROR}}}
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
             "description": "Submit and manage Slurm/PBS jobs on behalf of users (seed 000's HPC launcher)."},
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


def make_app(launcher: Launcher, *, token: str | None = None):
    """The aiohttp application over ``launcher`` (``token``: required as ``Authorization: Bearer``)."""
    from aiohttp import web

    def error(status: int, message: str):
        return web.json_response({"error": message}, status=status)

    @web.middleware
    async def guard(request, handler):
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return error(401, "a bearer token is required")
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"the body is larger than {MAX_BODY >> 20} MiB")
        except web.HTTPException as exc:
            return error(exc.status, exc.reason)
        except LauncherError as exc:
            return error(exc.status, str(exc))
        except Exception as exc:                  # never a bare 500 page: say what, log the rest
            import traceback

            traceback.print_exc(file=sys.stderr)
            return error(500, f"internal error in the launcher ({type(exc).__name__}: {exc})")

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

    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY)
    app.router.add_get("/v1/health", health, allow_head=False)
    app.router.add_get("/v1/jobs", jobs, allow_head=False)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs/{id}", job_route(launcher.status), allow_head=False)
    app.router.add_delete("/v1/jobs/{id}", job_route(launcher.cleanup))
    app.router.add_get("/v1/jobs/{id}/logs", job_route(launcher.logs), allow_head=False)
    app.router.add_post("/v1/jobs/{id}/cancel", job_route(launcher.cancel))
    app.router.add_get("/openapi.json", openapi, allow_head=False)
    return app


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
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            return usage(f"cannot read the token file {token_file}: {getattr(exc, 'strerror', None) or exc}")
        if len(token) < 16:
            return usage("the token must be at least 16 characters")
    elif tls_cert or tls_key or token_file:
        return usage("--token-file, --tls-cert and --tls-key go with --tcp (the unix socket is guarded by its "
                     "group instead)")
    if tls_key and not tls_cert:
        return usage("--tls-key needs --tls-cert")
    if tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            return usage(f"cannot load the TLS certificate {tls_cert}" + (f" and key {tls_key}" if tls_key else "")
                         + f": {getattr(exc, 'strerror', None) or exc}")
    try:
        launcher = Launcher(config)
    except LauncherError as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return 1
    app = make_app(launcher, token=token)
    if tcp:
        try:
            web.run_app(app, host=host.strip("[]"), port=int(port), ssl_context=context, print=None)
        except OSError as exc:
            print(f"tether: cannot listen on {tcp}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    else:
        import socket

        path = socket_path or config.data["launcher"]["socket"]
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)                    # the socket is made 0660 (only it: not the records)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        web.run_app(app, sock=sock, print=None)
    return 0
