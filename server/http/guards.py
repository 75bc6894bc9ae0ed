"""Checks a request passes before its body is decoded: bearer token, body size and content type."""

from __future__ import annotations

import hmac
from typing import IO

from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from latlab.server.errors import BadRequest, PayloadTooLarge, Unauthorized, UnsupportedMediaType
from latlab.server.protocol import HEADER_LENGTH, shown

_CHUNK = 64 * 1024
_CLIENT_LEFT = "the client closed the connection before the body ended"
ACCEPTED_TYPES = ("application/json", "application/octet-stream")


def check_bearer(expected: str, authorization: str | None) -> None:
    """Pass when no token is configured or the header carries it; compared in constant time."""
    if not expected:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("this route needs an 'Authorization: Bearer <token>' header")
    if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), expected.encode()):
        raise Unauthorized("the bearer token is not valid")


def check_length(content_length: int | None, limit: int) -> None:
    """Refuse a declared body over the limit before a byte of it is read."""
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge(
            f"body of {content_length} bytes is over this server's limit of {limit} bytes (max_body_bytes)"
        )


def check_content_type(mimetype: str, params: dict[str, str], binary: bool) -> None:
    """Infer bodies are JSON, or the binary tensor extension. No Content-Type at all is taken as either:
    many clients (tritonclient among them) send none."""
    if not mimetype:
        return
    if mimetype == "application/json":
        charset = params.get("charset", "utf-8").lower()
        if charset not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"JSON must be UTF-8, got charset {shown(charset)!r}")
        return
    if mimetype == "application/octet-stream":
        if not binary:
            raise UnsupportedMediaType(
                f"application/octet-stream bodies need the {HEADER_LENGTH} header (the binary tensor extension)"
            )
        return
    raise UnsupportedMediaType(
        f"Content-Type {shown(mimetype)!r} is not accepted; send application/json, or "
        f"application/octet-stream with {HEADER_LENGTH}"
    )


def binary_header_length(value: str | None) -> int | None:
    """The binary extension's JSON header length, or None when the header is absent."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:  # 18 digits: below 2**63, and int() is cheap
        raise BadRequest(f"{HEADER_LENGTH} must be a non-negative integer, got {shown(value)!r}")
    return int(value)


def read_declared(stream: IO[bytes], length: int) -> bytes:
    """Read a body of a declared Content-Length (already checked against the limit): exactly `length` bytes,
    never past them (a WSGI server may hand over the connection itself); fewer means the client left."""
    body = stream.read(length)
    if len(body) == length:  # what every server we know returns at once
        return body
    parts, total = [body], len(body)
    while total < length:
        more = stream.read(min(_CHUNK, length - total))
        if not more:
            raise BadRequest(_CLIENT_LEFT)
        parts.append(more)
        total += len(more)
    return b"".join(parts)


def read_body(stream: IO[bytes], limit: int) -> bytes:
    """Read at most `limit` bytes; a longer body (chunked, so undeclared) is refused once the limit is passed,
    without reading the rest. The stream must allow one byte past the limit (MAX_CONTENT_LENGTH = limit + 1),
    so a body of exactly `limit` bytes is told apart from a longer one."""
    parts: list[bytes] = []
    total = 0
    try:
        while total <= limit:
            chunk = stream.read(min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
    except RequestEntityTooLarge:
        total = limit + 1
    except ClientDisconnected:
        raise BadRequest(_CLIENT_LEFT) from None
    if total > limit:
        raise PayloadTooLarge(f"body is over this server's limit of {limit} bytes (max_body_bytes)")
    return b"".join(parts)
