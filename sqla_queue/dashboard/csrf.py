"""CSRF protection of the dashboard's actions: a signed cookie and a hidden form field.

A page that shows action forms gives the browser a random token twice: in a cookie
(``HttpOnly``, ``SameSite=Strict``, scoped to the dashboard's path) and in each form's
hidden ``csrf_token`` field. An action is done only when both arrive and match. Another
site can make a browser send the cookie, never read it, so it cannot fill in the field.

The cookie is signed (HMAC-SHA256 with the dashboard's secret): a plain double-submit
cookie can be planted by a sibling subdomain, and a planted token would then match a
planted field. A forged or foreign cookie fails the signature and is replaced.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

__all__ = ["COOKIE_NAME", "FIELD_NAME", "CsrfSigner"]

#: The cookie that carries the signed token.
COOKIE_NAME = "sqla_queue_csrf"
#: The hidden form field that carries the token.
FIELD_NAME = "csrf_token"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class CsrfSigner:
    """Mints, signs and checks CSRF tokens with one secret.

    ``secret``: bytes or text shared by every process that serves the dashboard (behind a
    load balancer each must accept the others' cookies); ``None`` draws a random one, good
    for one process (a restart makes browsers fetch a fresh token with their next page).
    """

    def __init__(self, secret: str | bytes | None = None) -> None:
        if secret is None:
            secret = secrets.token_bytes(32)
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(key) < 16:
            raise ValueError("the dashboard's secret must be at least 16 bytes long")
        self._key = key

    def _signature(self, token: str) -> str:
        return _b64(hmac.new(self._key, token.encode("ascii"), hashlib.sha256).digest())

    def new_cookie(self) -> tuple[str, str]:
        """A fresh ``(token, cookie value)``."""
        token = secrets.token_urlsafe(32)
        return token, f"{token}.{self._signature(token)}"

    def token_of(self, cookie: str | None) -> str | None:
        """The token a cookie value carries if its signature is ours, else ``None``."""
        if not cookie or cookie.count(".") != 1:
            return None
        token, signature = cookie.split(".")
        if not token.isascii() or not signature.isascii():
            return None
        expected = self._signature(token)
        return token if hmac.compare_digest(expected, signature) else None

    def check(self, cookie: str | None, submitted: str | None) -> bool:
        """Whether a form's token ``submitted`` matches the signed ``cookie``."""
        token = self.token_of(cookie)
        if token is None or not submitted or not submitted.isascii():
            return False
        return hmac.compare_digest(token, submitted)
