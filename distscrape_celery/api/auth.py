"""The job API's bearer token: read from the environment or a file (never the command line),
and every request's ``Authorization: Bearer`` compared with it in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated, Optional

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..errors import ConfigError
from ..settings import ENV_PREFIX, Settings, check_api_token

bearer = HTTPBearer(auto_error=False, description="The token the API was started with.")


def load_token(settings: Settings, token_file: Optional[str] = None) -> str:
    """The token: the first line of ``token_file`` (or of the settings' ``api_token_file``),
    else the settings' ``api_token``. ConfigError without one, or with one too weak."""
    path = token_file or settings.api_token_file
    if path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the API token file {path!r}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
        token = lines[0].strip() if lines else ""
        try:
            return check_api_token(token)
        except ValueError as exc:
            raise ConfigError(f"the API token in {path!r} {exc}") from None
    if settings.api_token is None:
        raise ConfigError(
            f"the API needs a token: set {ENV_PREFIX}API_TOKEN, or {ENV_PREFIX}API_TOKEN_FILE "
            "(or --token-file) to a file that holds it"
        )
    return settings.api_token


def require_token(
    request: Request,
    credentials: Annotated[Optional[HTTPAuthorizationCredentials], Depends(bearer)],
) -> None:
    """Refuse (401) a request without the API's token as its bearer credentials."""
    expected: bytes = request.app.state.token
    given = credentials.credentials.encode() if credentials is not None else b""
    if not hmac.compare_digest(given, expected):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
