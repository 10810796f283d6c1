"""Turns a failed model request into one of our errors, in one place.

Temporal owns retries: the model client sends each request once and raises
`ModelUnavailable` (retryable, carrying the server's retry-after hint) or
`ModelRequestRejected` (not retryable). Every "is another try worth it"
decision made from an HTTP status or a transport failure lives here.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from datetime import UTC
from http import HTTPStatus
from typing import Any

import httpx

from temporal_rollouts.core.errors import (
    ModelError,
    ModelRequestRejected,
    ModelStalled,
    ModelUnavailable,
    ModelUnreachable,
)

RETRYABLE_STATUSES = frozenset({408, 409, 429})
SNIPPET_CHARS = 300
REDACTED = "[redacted]"


def is_retryable_status(status_code: int) -> bool:
    return status_code in RETRYABLE_STATUSES or status_code >= 500


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait before the next try, from `retry-after-ms` or `retry-after`
    (delay in seconds or an HTTP date); None when absent or unreadable."""
    lowered = {key.lower(): value for key, value in headers.items()}
    if (millis := _non_negative_number(lowered.get("retry-after-ms"))) is not None:
        return millis / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    if (seconds := _non_negative_number(raw)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def error_for_status(
    status_code: int,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    secrets: Iterable[str] = (),
    now: float | None = None,
) -> ModelError | None:
    """The error a model-server response stands for; None for a 2xx."""
    if 200 <= status_code < 300:
        return None
    message = f"model server answered HTTP {_status_label(status_code)}"
    if snippet := error_snippet(body, secrets=secrets):
        message = f"{message}: {snippet}"
    if is_retryable_status(status_code):
        return ModelUnavailable(message, status_code=status_code, retry_after_s=parse_retry_after(headers, now=now))
    return ModelRequestRejected(message, status_code=status_code)


def raise_for_status(response: httpx.Response, *, secrets: Iterable[str] = ()) -> None:
    """Raise the typed error for a non-2xx response; the body must already be read."""
    error = error_for_status(response.status_code, response.headers, response.content, secrets=secrets)
    if error is not None:
        raise error


def error_for_exception(exc: BaseException, *, secrets: Iterable[str] = ()) -> ModelError:
    """The error a request that got no response stands for.

    Timeouts and connection failures are retryable; a request that could never
    be sent (bad URL or scheme, invalid header) is not.
    """
    detail = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {redact(str(exc), secrets)}"
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL)):
        return ModelRequestRejected(f"model request could not be sent ({detail})")
    if isinstance(exc, httpx.ConnectTimeout):
        return ModelUnreachable(f"model unreachable: connect timed out ({detail})")
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return ModelStalled(f"model stalled: no answer within the request timeout ({detail})")
    if isinstance(exc, (httpx.ConnectError, ConnectionRefusedError)):
        return ModelUnreachable(
            f"model unreachable: {'connection refused' if _refused(exc) else 'cannot connect'} ({detail})"
        )
    if isinstance(exc, (httpx.RequestError, OSError)):
        return ModelUnavailable(f"model server unreachable ({detail})")
    return ModelError(f"model request failed ({detail})", retryable=False)


def _refused(exc: BaseException | None) -> bool:
    """Whether a connect error was a refusal, anywhere in its chain (httpx words it "All connection attempts failed")."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ConnectionRefusedError) or "refused" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def error_snippet(body: bytes | str, *, secrets: Iterable[str] = (), limit: int = SNIPPET_CHARS) -> str:
    """A short, single-line excerpt of the server's error text, secrets removed."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if parsed is not None:
        text = _error_text(parsed)
    text = redact(re.sub(r"\s+", " ", text).strip(), secrets)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def _error_text(parsed: Any) -> str:
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for candidate in (error, parsed.get("detail"), parsed.get("message")):
            if isinstance(candidate, str):
                return candidate
    return json.dumps(parsed, ensure_ascii=False)


def _non_negative_number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _status_label(status_code: int) -> str:
    try:
        return f"{status_code} {HTTPStatus(status_code).phrase}"
    except ValueError:
        return str(status_code)
