"""What keeps the console safe to open on messages an attacker wrote, and to leave running.

- **Escaping.** Every page is a Jinja2 template with autoescape on, and nothing from a daemon
  (bodies, headers, names, user agents) is ever marked safe. The Content-Security-Policy below
  allows scripts only from the console's own ``/static`` files (no inline script, no ``eval``),
  so even markup that slipped through could run nothing; htmx is configured without eval and
  without script tags in swapped content (``base.html``).
- **CSRF.** Every state-changing request is a POST carrying ``csrf_token``, the HMAC of the
  browser's session cookie under a key made at start-up; the cookie is ``SameSite=Strict`` and
  ``HttpOnly``. A POST without a matching pair is refused (403) before anything is done. The key
  lives in memory: a restarted console asks the user to reload the page.
- **Who may act.** ``--read-only`` refuses every action (the pages hide their buttons);
  ``--admin-user`` (repeatable) with ``--acl-http-header`` (nsqadmin's flags) lets only
  requests whose header names one of those users act, as nsqadmin's
  ``isAuthorizedAdminRequest``: the header is set by the authenticating proxy in front.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from lmq_client.admin.web.asgi import HTTPException, Request
from lmq_client.admin.web.config import ConsoleConfig

__all__ = ["SECURITY_HEADERS", "SESSION_COOKIE", "Guard"]

SESSION_COOKIE = "lmq_console_session"

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
}


class Guard:
    """CSRF tokens and the permission to act (module docstring)."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self._key = secrets.token_bytes(32)

    def session(self, request: Request) -> tuple[str, bool]:
        """The browser's session id, and whether it is new (to be set as a cookie)."""
        current = request.cookies.get(SESSION_COOKIE, "")
        if len(current) == 32 and all(c in "0123456789abcdef" for c in current):
            return current, False
        return secrets.token_hex(16), True

    def token(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def cookie(self, session: str) -> str:
        path = self.config.base_path or "/"
        return f"{SESSION_COOKIE}={session}; Path={path}; HttpOnly; SameSite=Strict"

    def user(self, request: Request) -> str:
        """Who the proxy says this is (``--acl-http-header``), "" if nobody."""
        return request.headers.get(self.config.acl_http_header.lower(), "")

    def refusal(self, request: Request) -> str | None:
        """Why this request may not act, or None if it may."""
        if self.config.read_only:
            return "the console is read-only (--read-only)"
        if self.config.admin_users and self.user(request) not in self.config.admin_users:
            return (f"only the admin users may do this ({self.config.acl_http_header} "
                    "names none of them)")  # fmt: skip
        return None

    async def check_post(self, request: Request) -> None:
        """Raise 403 unless this POST may act and carries the session's CSRF token."""
        reason = self.refusal(request)
        if reason is not None:
            raise HTTPException(403, reason)
        session = request.cookies.get(SESSION_COOKIE, "")
        sent = await request.field("csrf_token")
        if not session or not sent or not hmac.compare_digest(sent, self.token(session)):
            raise HTTPException(403, "the form's CSRF token does not match this browser's "
                                     "session: reload the page and try again")
