"""Keep a backend's configured credentials out of everything relayed to a client.

A remote provider may echo what it was sent (an ``X-Api-Key`` in a 401 body, the bearer token in
a debug field), in any encoding: as is, JSON ``\\u``-escaped, percent-encoded or base64. Every
configured secret of a backend (its ``api_key`` and the values of its credential-like
``headers:``) is replaced by ``[redacted]`` in every body, stream event and header the gateway
relays from it. Text with JSON escapes or percent-escapes is decoded before it is searched, so a
partly escaped secret is found too; the decoded form is relayed only when it held a secret.

Limitation: a secret split across two stream events (two generated tokens) is not found.
"""

import base64
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from urllib.parse import quote, quote_plus, unquote_to_bytes

REDACTED = b"[redacted]"
_CREDENTIAL_NAME = re.compile(r"auth|key|token|secret|passw|cookie|credential|signature|session", re.IGNORECASE)
"""Header names whose values are secrets whatever their length."""
_LONG_VALUE_CHARS = 24
"""Other configured header values this long are treated as secrets too (opaque tokens under
names this list does not know); shorter ones (``anthropic-version: 2023-06-01``) are not, so
common text is never rewritten."""
_MIN_SECRET_CHARS = 4
_MIN_ENCODED_CHARS = 8
"""Encoded fragments shorter than this are not searched for (they would match ordinary text)."""
_JSON_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|(/)|.)", re.DOTALL)
"""One JSON escape, left to right, so an escaped backslash is never read as the start of another."""
_SCHEMES = ("bearer ", "basic ", "token ")
_BASE64_CHAR = rb"[A-Za-z0-9+/_-]"
_ASCII_ESCAPE = rb"\\u00[2-7][0-9a-fA-F]|\\/"
"""A JSON escape of a printable ASCII character: the only ones an ASCII secret can hide behind."""
_ANY_ESCAPE = rb"\\u[0-9a-fA-F]{4}|\\/"
_PERCENT_ESCAPE = re.compile(rb"%[0-9a-fA-F]{2}")


def backend_secrets(api_key: str | None, headers: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets of one backend: its API key and its credential-like header values (also without
    an ``Authorization`` scheme such as ``Bearer``)."""
    found = [api_key] if api_key else []
    for name, value in headers.items():
        if _CREDENTIAL_NAME.search(name) or len(value) >= _LONG_VALUE_CHARS:
            found.append(value)
            scheme = next((s for s in _SCHEMES if value.lower().startswith(s)), None)
            if scheme is not None:
                found.append(value[len(scheme) :].strip())
    return tuple(sorted({secret for secret in found if len(secret) >= _MIN_SECRET_CHARS}, key=len, reverse=True))


class Redactor:
    """Replaces a fixed set of secrets, in each encoding, by ``[redacted]``.

    Each encoded form is looked for with ``bytes.__contains__`` (C speed, no backtracking); a
    regular expression runs only when one is there, and text is decoded only when it holds an
    escape of a character some secret has."""

    def __init__(self, secrets: Iterable[str]) -> None:
        encoded = [secret.encode("utf-8", "surrogatepass") for secret in secrets]
        self._plain = sorted({form for secret in encoded for form in _plain_forms(secret)}, key=len, reverse=True)
        self._base64 = sorted({form for secret in encoded for form in _base64_fragments(secret)}, key=len, reverse=True)
        ascii_only = all(secret.isascii() for secret in encoded)
        self._escape = re.compile(_ASCII_ESCAPE if ascii_only else _ANY_ESCAPE)

    def __bool__(self) -> bool:
        return bool(self._plain)

    def redact(self, data: bytes) -> bytes:
        """``data`` with every secret replaced, searched as is, JSON-unescaped and percent-decoded."""
        if not self._plain:
            return data
        if b"\\" in data and self._escape.search(data):
            unescaped = _JSON_ESCAPE.sub(_unescape, data)
            if self._found(unescaped):
                data = unescaped
        if b"%" in data and _PERCENT_ESCAPE.search(data):
            decoded = unquote_to_bytes(data)
            if self._found(decoded):
                data = decoded
        return self._replace(data)

    def redact_text(self, value: str) -> str:
        """A header value with every secret replaced."""
        if not self._plain:
            return value
        return self.redact(value.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def _found(self, data: bytes) -> bool:
        return any(form in data for form in self._plain) or any(form in data for form in self._base64)

    def _replace(self, data: bytes) -> bytes:
        plain = [form for form in self._plain if form in data]
        fragments = [form for form in self._base64 if form in data]
        if not plain and not fragments:
            return data
        alternatives = [re.escape(form) for form in plain]
        if fragments:
            # The base64 groups at a fragment's edges go too (they hold bytes of the secret);
            # bounded repeats keep the search linear in the text's length.
            joined = b"|".join(map(re.escape, fragments))
            alternatives.insert(0, _BASE64_CHAR + b"{0,4}(?:" + joined + b")" + _BASE64_CHAR + b"{0,4}={0,2}")
        return re.sub(b"|".join(alternatives), REDACTED, data)


NO_SECRETS = Redactor(())


@lru_cache(maxsize=256)
def redactor_for(secrets: tuple[str, ...]) -> Redactor:
    """One redactor per set of secrets (a backend's, kept across requests and reloads)."""
    return Redactor(secrets) if secrets else NO_SECRETS


def _unescape(match: re.Match[bytes]) -> bytes:
    """A JSON escape as the UTF-8 bytes it stands for; quotes, backslashes, controls and
    surrogates stay escaped (replacing them would change what the JSON means or make it invalid)."""
    if match[2] is not None:
        return b"/"
    if match[1] is None:
        return match[0]
    code = int(match[1], 16)
    if code < 0x20 or code in (0x22, 0x5C) or 0xD800 <= code <= 0xDFFF:
        return match[0]
    return chr(code).encode()


def _plain_forms(secret: bytes) -> set[bytes]:
    """``secret`` as it may appear: raw, JSON-escaped, percent-encoded and hex."""
    text = secret.decode("utf-8", "surrogatepass")
    json_escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    forms = {
        secret,
        json_escaped.encode("utf-8", "surrogatepass"),
        json_escaped.replace("/", "\\/").encode("utf-8", "surrogatepass"),
        quote(text, safe="").encode(),
        quote_plus(text, safe="").encode(),
        secret.hex().encode(),
        secret.hex().upper().encode(),
    }
    return {form for form in forms if len(form) >= _MIN_SECRET_CHARS}


def _base64_fragments(secret: bytes) -> set[bytes]:
    """The characters of ``secret``'s base64 (standard and URL-safe) that depend on the secret
    alone, at each of the three alignments it may start at in a longer encoded text."""
    fragments = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret)
        fragment = encoded[4 if offset else 0 : (offset + len(secret)) // 3 * 4]
        if len(fragment) >= _MIN_ENCODED_CHARS:
            fragments.add(fragment)
            fragments.add(fragment.replace(b"+", b"-").replace(b"/", b"_"))
    return fragments
