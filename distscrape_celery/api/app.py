"""The job API application: its routes behind the token, the package's errors as HTTP statuses,
a bound on request bodies, the OpenAPI description, and the dashboard's static files."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ..errors import (
    ConfigError, DistscrapeError, JobConflict, JobNotFound, JobStateError, SpecError,
    TrackerUnavailable,
)
from .auth import require_token
from .runtime import Runtime

# Requests larger than this are refused (413) before they are read whole: a spec with its seeds
# fits many times over; more seeds go in more requests.
DEFAULT_MAX_BODY = 1024 * 1024
STATIC = resources.files(__package__) / "static"
# The dashboard loads nothing but its own files, and no page may frame it.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_app(runtime: Runtime, token: str, *, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The application over ``runtime``: every ``/api`` route (but the OpenAPI description)
    requires ``token`` as bearer credentials; bodies over ``max_body`` bytes are refused."""
    from . import jobs, schedules, stream

    app = FastAPI(
        title="distscrape job API", version="1",
        description="Create, watch and control the crawl's jobs and schedules. Every route "
                    "under /api but this description needs `Authorization: Bearer TOKEN`.",
        openapi_url="/api/openapi.json", docs_url=None, redoc_url=None,  # they load a CDN's
        max_body_size=max_body,
    )
    # The streams' events are described by itemSchema, which OpenAPI 3.2 brought.
    app.openapi_version = "3.2.0"
    app.state.runtime = runtime
    app.state.token = token.encode()
    guarded = [Depends(require_token)]
    for router in (jobs.router, schedules.router, stream.router):
        app.include_router(router, dependencies=guarded)
    _add_errors(app)
    _add_dashboard(app)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def _problem(field: str, message: str) -> dict[str, Any]:
    """A problem in the shape of FastAPI's own validation errors, with the spec's field."""
    loc = ["body", *field.split(".")] if field and not field.startswith("(") else ["body"]
    return {"loc": loc, "msg": message, "type": "value_error", "field": field or None}


# The package's errors, most specific first, as HTTP statuses.
STATUSES: list[tuple[type[Exception], int]] = [
    (JobNotFound, 404), (JobConflict, 409), (JobStateError, 409), (ConfigError, 422),
    (TrackerUnavailable, 503),
]


def _add_errors(app: FastAPI) -> None:
    async def refused(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, SpecError):
            return JSONResponse({"detail": [_problem(f, m) for f, m in exc.problems]}, 422)
        for kind, status in STATUSES:
            if isinstance(exc, kind):
                if status == 422:  # a ConfigError names its field in its message
                    return JSONResponse({"detail": [_problem("", str(exc))]}, 422)
                return JSONResponse({"detail": str(exc)}, status)
        return JSONResponse({"detail": str(exc)}, 400)

    app.add_exception_handler(DistscrapeError, refused)

    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, which may be a large body: this one does not.
        problems = [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
                    for e in exc.errors()]
        return JSONResponse({"detail": problems}, 422)

    app.add_exception_handler(RequestValidationError, invalid)


def _add_dashboard(app: FastAPI) -> None:
    """The dashboard: ``/`` and its files under ``/static``. They hold no data, so they need no
    token; the page asks for it and sends it with every request it makes."""
    index = STATIC / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(str(index), media_type="text/html")

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
