"""What stands in front of the routes, outermost first:

    HostCheck   a loopback bind answers only Host names that are this machine (Ollama's
                allowedHostsMiddleware): a page whose name was rebound to 127.0.0.1 gets 403
    CORS        starlette's CORSMiddleware with llama-server's --cors-* defaults, outside the key
                check so that preflights (which carry no key) work
    BodyGuard   the body read whole up to a cap (httplib's 100 MiB; 413 beyond it, nothing read
                past it) and replayed to the route; a browser's form or text/plain POST is refused
                (415: a JSON body from a web page must come through a CORS preflight)
    ApiKeys     llama-server's key check (Authorization: Bearer KEY or X-Api-Key; /health and the
                web page public), several keys, each compared in constant time

Each refusal is one JSON error in the route's shape: Ollama's {"error": "..."} under /api/,
llama-server's {"error": {"message", "type", "code"}} elsewhere.
"""
from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

from bankml.server.api import ollama, openai
from bankml.server.jsonio import JSONResponse

PUBLIC = {"/", "/health", "/v1/health"}         # no key needed (llama-server's public endpoints)
MIB = 1024 * 1024


@dataclass(frozen=True)
class HttpOptions:
    """`bankml serve`'s HTTP settings (llama-server's names and defaults where it has them)."""
    host: str = "127.0.0.1"                 # the bind address: loopback turns the Host check on
    api_keys: tuple[str, ...] = ()
    cors_origins: str = "*"                 # comma-separated, "*" or "localhost" (llama-server's)
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    max_body: int = 100 * MIB               # CPPHTTPLIB_PAYLOAD_MAX_LENGTH
    sse_ping_s: float = 30.0                # --sse-ping-interval; <= 0: no pings


def read_key_file(path: str) -> list[str]:
    """llama-server's --api-key-file: one key a line, lines starting with '#' are comments."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f if line.rstrip("\r\n") and not line.startswith("#")]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"failed to open file '{path}': {e}") from None


def error_response(path: str, message: str, status: int, kind: str) -> JSONResponse:
    """A refusal in the shape of the route it was meant for."""
    body = ollama.error_body(message) if path.startswith("/api/") else openai.error_body(message, status, kind)
    return JSONResponse(body, status_code=status)


# ---------------------------------------------------------------- Host

def is_loopback_bind(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Machine:
    """This machine's name and its addresses as the name resolves (Ollama lists the interfaces'
    addresses), looked up once when the server starts."""
    name: str
    addresses: frozenset[str]

    @classmethod
    def here(cls) -> "Machine":
        name = socket.gethostname()
        try:
            addresses = frozenset(socket.gethostbyname_ex(name)[2])
        except OSError:
            addresses = frozenset()
        return cls(name.lower(), addresses)


def allowed_host(host_header: str, machine: Machine | None = None) -> bool:
    """Ollama's rule for a loopback bind: a loopback, private, unspecified or own IP address, or
    a name that is empty, localhost, this machine's name, or under .localhost, .local, .internal."""
    machine = machine or Machine.here()
    host = host_header.lower()
    if host.startswith("["):                            # [::1]:8080
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        return ip.is_loopback or ip.is_private or ip.is_unspecified or host in machine.addresses
    if host in ("", "localhost") or host == machine.name:
        return True
    return any(host.endswith("." + tld) for tld in ("localhost", "local", "internal"))


class HostCheck:
    def __init__(self, app, bind_host: str):
        self.app, self.on = app, is_loopback_bind(bind_host)
        self.machine = Machine.here() if self.on else None

    async def __call__(self, scope, receive, send):
        if self.on and scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not allowed_host(host, self.machine):
                resp = error_response(scope["path"], f"Host '{host}' is not this machine: a loopback server "
                                      "answers only its own names (bind --host 0.0.0.0 to serve others)",
                                      403, "forbidden_error")
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


# ---------------------------------------------------------------- CORS

def cors(app, o: HttpOptions):
    """llama-server's CORS: origins "*" (with credentials: the Origin echoed), "localhost" (only
    a localhost Origin reflected) or a list; its methods and headers."""
    origins = [s.strip() for s in o.cors_origins.split(",") if s.strip()]
    regex = None
    if origins == ["localhost"]:
        origins, regex = [], r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
    methods = [s.strip() for s in o.cors_methods.split(",") if s.strip()]
    headers = [s.strip() for s in o.cors_headers.split(",") if s.strip()]
    return CORSMiddleware(app, allow_origins=origins, allow_origin_regex=regex, allow_methods=methods,
                          allow_headers=headers, allow_credentials=o.cors_credentials)


# ---------------------------------------------------------------- the body

def is_json_type(content_type: str) -> bool:
    main = content_type.split(";")[0].strip().lower()
    return main == "application/json" or main.endswith("+json")


class BodyGuard:
    """POST bodies: at most max_body bytes, read before the route runs and handed to it whole;
    the connection's later messages (a disconnect) pass through. A request from a web page (it
    carries Origin) must declare JSON: the form and text/plain types are the ones a page may send
    without asking first. Scripts (curl -d sends a form type, no Origin) are not affected."""

    def __init__(self, app, max_body: int):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        h, path = Headers(scope=scope), scope["path"]
        if "origin" in h and not is_json_type(h.get("content-type", "")):
            resp = error_response(path, f"Content-Type must be application/json, not "
                                  f"'{h.get('content-type', '')}'", 415, "invalid_request_error")
            return await resp(scope, receive, send)
        too_big = error_response(path, f"the request body exceeds {self.max_body} bytes (--max-body)",
                                 413, "invalid_request_error")
        length = h.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return await too_big(scope, receive, send)
        chunks, n = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":           # gone before the body arrived
                return
            n += len(msg.get("body", b""))
            if n > self.max_body:
                return await too_big(scope, receive, send)
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        return await self.app(scope, replay, send)


# ---------------------------------------------------------------- keys

class ApiKeys:
    def __init__(self, app, keys: tuple[str, ...]):
        self.app, self.keys = app, [k.encode() for k in keys]

    def valid(self, key: str) -> bool:
        given = key.encode("latin-1", "replace")
        ok = False
        for k in self.keys:                         # every key compared: the time names none
            ok |= secrets.compare_digest(k, given)
        return ok

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.keys and scope["path"] not in PUBLIC and scope["method"] != "OPTIONS":
            h = Headers(scope=scope)
            key = h.get("authorization") or h.get("x-api-key", "")
            if key.startswith("Bearer "):
                key = key[len("Bearer "):]
            if not self.valid(key):
                resp = error_response(scope["path"], "Invalid API Key", 401, "authentication_error")
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def guarded(app, o: HttpOptions):
    """The app behind every layer above, outermost first: Host, CORS, body, keys."""
    return HostCheck(cors(BodyGuard(ApiKeys(app, o.api_keys), o.max_body), o), o.host)
