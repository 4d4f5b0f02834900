"""What stands in front of the routes (bankml/server/guard.py), on a bare app: the Host check of a
loopback bind, CORS preflights without a key, the body cap, the web page's JSON rule, several keys."""
from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from bankml.server.guard import HttpOptions, allowed_host, guarded, read_key_file


async def echo(request: Request):
    body = await request.body()
    return JSONResponse({"n": len(body)})


async def health(request: Request):
    return JSONResponse({"status": "ok"})


def client(**kw) -> TestClient:
    app = Starlette(routes=[Route("/v1/chat/completions", echo, methods=["POST"]),
                            Route("/api/chat", echo, methods=["POST"]), Route("/health", health),
                            Route("/v1/models", health)])
    return TestClient(guarded(app, HttpOptions(**kw)), base_url="http://127.0.0.1:8080")


@pytest.mark.parametrize("host,ok", [
    ("127.0.0.1:8080", True), ("localhost:8080", True), ("LOCALHOST", True), ("[::1]:8080", True),
    ("127.5.6.7", True), ("192.168.1.20:8080", True), ("10.0.0.1", True), ("0.0.0.0", True),
    ("my-box.local", True), ("app.localhost:3000", True), ("db.internal", True), ("", True),
    ("evil.example.com:8080", False), ("8.8.8.8", False), ("localhost.evil.com", False), ("127.0.0.1.nip.io", False),
])
def test_allowed_hosts_follow_ollama(host, ok):
    assert allowed_host(host) is ok


def test_loopback_bind_refuses_a_rebound_name():
    c = client()
    r = c.get("/health", headers={"Host": "attacker.example:8080"})
    assert r.status_code == 403 and "attacker.example" in r.json()["error"]["message"]
    r = c.post("/api/chat", json={}, headers={"Host": "attacker.example"})
    assert r.status_code == 403 and isinstance(r.json()["error"], str)       # Ollama's error shape
    assert c.get("/health").status_code == 200
    # bound to every address: names are the operator's business, as in Ollama
    assert client(host="0.0.0.0").get("/health", headers={"Host": "server.example"}).status_code == 200


def test_cors_defaults_are_llama_servers_and_preflights_need_no_key():
    c = client(api_keys=("k1",))
    r = c.options("/v1/chat/completions", headers={"Origin": "http://example.com",
                                                   "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://example.com"      # "*" with credentials: echoed
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-headers"] == "authorization,content-type"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = c.post("/v1/chat/completions", json={}, headers={"Origin": "http://example.com", "Authorization": "Bearer k1"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", "http://example.com")


def test_cors_localhost_reflects_only_local_origins():
    c = client(cors_origins="localhost")
    pre = {"Access-Control-Request-Method": "POST"}
    ok = c.options("/v1/chat/completions", headers={"Origin": "http://localhost:5173", **pre})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:5173"
    bad = c.options("/v1/chat/completions", headers={"Origin": "https://example.com", **pre})
    assert "access-control-allow-origin" not in bad.headers


def test_body_cap():
    c = client(max_body=1000)
    assert c.post("/v1/chat/completions", content=b"x" * 1000).json() == {"n": 1000}
    r = c.post("/v1/chat/completions", content=b"x" * 1001)
    assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]

    def chunks():                                   # no Content-Length: counted as it arrives
        for _ in range(5):
            yield b"y" * 300
    r = c.post("/v1/chat/completions", content=chunks())
    assert r.status_code == 413
    assert c.post("/api/chat", content=b"x" * 2000).json()["error"].startswith("the request body exceeds")


def test_a_web_pages_simple_post_is_refused_scripts_are_not():
    c = client()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = c.post("/v1/chat/completions", content=b"{}", headers={"Origin": "http://evil.example", "Content-Type": ctype})
        assert r.status_code == 415, ctype
    ok = c.post("/v1/chat/completions", content=b"{}",
                headers={"Origin": "http://localhost:3000", "Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200
    # curl -d (a form type, no Origin) and clients that send no type still work
    assert c.post("/api/chat", content=b"{}", headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 200
    assert c.post("/api/chat", content=b"{}").status_code == 200


def test_several_keys(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# the team's keys\nalpha\n\nbeta\n")
    keys = read_key_file(str(f))
    assert keys == ["alpha", "beta"]
    c = client(api_keys=("gamma", *keys))
    for key in ("alpha", "beta", "gamma"):
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert c.get("/v1/models", headers={"X-Api-Key": "beta"}).status_code == 200
    for headers in ({}, {"Authorization": "Bearer alph"}, {"Authorization": "Bearer alphaa"}, {"X-Api-Key": "delta"}):
        r = c.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"] == {"message": "Invalid API Key",
                                                             "type": "authentication_error", "code": 401}
    assert c.get("/health").status_code == 200                  # public, as llama-server's
    with pytest.raises(ValueError, match="failed to open file"):
        read_key_file(str(tmp_path / "missing"))
