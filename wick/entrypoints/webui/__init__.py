"""The built-in chat page: `wick serve --ui` serves it at `/`, its files under `/ui/`.

The page is static (HTML, CSS, ES modules; its Markdown and highlighting libraries are vendored under
`static/vendor/`) and talks to the server's own OpenAI API (/v1/models, /v1/chat/completions), so it
needs nothing the API does not already offer. Model text never becomes live HTML: the page sanitizes
what it renders, and the Content-Security-Policy below allows no inline script, no other origin and
no remote images on top of that."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).with_name("static")

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def mount_webui(app: FastAPI) -> None:
    """Adds the chat page to `app`: `index.html` at `/`, the other files under `/ui/`."""
    index = (STATIC_DIR / "index.html").read_bytes()

    @app.get("/", include_in_schema=False)
    async def webui_index() -> Response:
        return Response(index, media_type="text/html; charset=utf-8", headers=_HEADERS)

    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="webui")
