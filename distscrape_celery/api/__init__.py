"""The job API that ``distscrape api`` serves: FastAPI on uvicorn, every route behind a bearer
token, and the dashboard, one static page served beside it.

* :mod:`.app`: the application (:func:`create_app`): routes, errors, limits, the dashboard;
* :mod:`.auth`: the token, where it comes from and how a request is checked against it;
* :mod:`.models`: what the routes answer, as pydantic models (the OpenAPI description's);
* :mod:`.jobs`, :mod:`.schedules`, :mod:`.stream`: the routes, each over the same functions as
  the ``distscrape`` commands (``core.jobs``, ``core.schedules``, ``core.seeding``).
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
