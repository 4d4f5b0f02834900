"""`GET /`: the web chat page (web/index.html, one static file of HTML, CSS and JavaScript, no build
step) for a browser, Ollama's probe answer ("Ollama is running", text/plain) for any other client.

A browser is a request whose Accept names text/html; integrations that check for an Ollama server
send none (or */*). The page is public, as llama-server's UI is (its frontend_paths in
tools/server/server-http.cpp); its own calls to the API send the key the page is given.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse

PAGE = Path(__file__).with_name("web") / "index.html"
OLLAMA_PROBE = "Ollama is running"


@cache
def page() -> bytes:
    return PAGE.read_bytes()


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "").lower()


async def root(request: Request):
    if wants_html(request):
        return HTMLResponse(page(), headers={"Cache-Control": "no-cache", "Vary": "Accept"})
    return PlainTextResponse(OLLAMA_PROBE, headers={"Vary": "Accept"})
