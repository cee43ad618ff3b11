"""Who may act in ``lmqadmin web``: read-only mode, ``--admin-user`` with ``--acl-http-header``,
CSRF, the security headers -- checked from a real browser against real daemons.

Rules for this module: as ``test_pages.py``; a refused action is tried both through the page
(its buttons are gone) and by a forged POST made from the page itself with the page's own
CSRF token (so only the rule under test can refuse it), and the daemons are checked unchanged.
"""

from __future__ import annotations

from typing import Any

from .conftest import Cluster, Console

FORGE = """async ([url, fields]) => {
    const form = new URLSearchParams(fields);
    const token = document.querySelector('input[name=csrf_token]');
    if (token && !('csrf_token' in fields)) form.set('csrf_token', token.value);
    const r = await fetch(url, {method: 'POST', body: form});
    return [r.redirected ? 303 : r.status, await r.text()];
}"""


def forge(page: Any, console: Console, fields: dict[str, str]) -> tuple[int, str]:
    """POST the fields from the page (with its CSRF token unless given): the status, 303 for
    an action done (the console answers it with a redirect, which fetch follows)."""
    status, text = page.evaluate(FORGE, [console.url("/actions/topic"), fields])
    return int(status), str(text)


def test_read_only_mode_shows_no_action_and_refuses_every_one(
    cluster: Cluster, console_factory: Any, page: Any
) -> None:
    cluster.create("ro", "c")
    writable = console_factory()
    writable.settle()
    page.goto(writable.url("/topics/ro"))
    token = page.get_attribute("input[name=csrf_token]", "value")
    assert token

    console = console_factory("--read-only")
    console.settle()
    page.goto(console.url("/topics/ro"))
    assert page.inner_text("#read-only") == "read-only"
    assert page.locator("main form[method=post]").count() == 0
    status, text = forge(page, console, {"topic": "ro", "action": "pause", "csrf_token": "x"})
    assert status == 403 and "read-only" in text
    assert not any(cluster.stats(n, "ro")["paused"] for n in cluster.nodes)  # type: ignore[index]
    for path in ("/publish/ro", "/policy/ro", "/dead-letters/ro/c", "/replay/ro"):
        page.goto(console.url(path))
        assert page.locator("main form[method=post]").count() == 0, path


def test_acl_header_lets_only_admin_users_act(
    cluster: Cluster, console_factory: Any, browser: Any
) -> None:
    cluster.create("acl", "c")
    console = console_factory("--admin-user=alice", "--acl-http-header=X-Auth-User")
    console.settle()
    for user, allowed in (("mallory", False), ("", False), ("alice", True)):
        headers = {"X-Auth-User": user} if user else {}
        context = browser.new_context(extra_http_headers=headers)
        try:
            page = context.new_page()
            page.goto(console.url("/topics/acl"))
            buttons = page.locator('button:text-is("Pause topic")').count()
            assert buttons == (1 if allowed else 0), user
            if not allowed:
                assert page.inner_text("#not-admin") == "view only"
            status, text = forge(page, console, {"topic": "acl", "action": "pause"})
            paused = [cluster.stats(n, "acl")["paused"] for n in cluster.nodes]  # type: ignore[index]
            if allowed:
                assert status == 303 and paused == [True, True]
            else:
                assert status == 403 and "admin users" in text, text
                assert paused == [False, False]
        finally:
            context.close()


def test_posts_without_the_sessions_csrf_token_are_refused(
    cluster: Cluster, console_factory: Any, page: Any
) -> None:
    cluster.create("csrf", "c")
    console = console_factory()
    console.settle()
    page.goto(console.url("/topics/csrf"))
    for token in ("", "0" * 64, "not-a-token"):
        status, text = forge(page, console, {"topic": "csrf", "action": "pause",
                                             "csrf_token": token})  # fmt: skip
        assert status == 403 and "CSRF" in text, (token, status)
    # The token of another browser's session is refused too.
    other = page.context.browser.new_context()
    try:
        other_page = other.new_page()
        other_page.goto(console.url("/topics/csrf"))
        foreign = other_page.get_attribute("input[name=csrf_token]", "value")
    finally:
        other.close()
    status, _ = forge(page, console, {"topic": "csrf", "action": "pause", "csrf_token": foreign})
    assert status == 403
    assert not any(cluster.stats(n, "csrf")["paused"] for n in cluster.nodes)  # type: ignore[index]
    # With this session's own token, the same POST works.
    status, _ = forge(page, console, {"topic": "csrf", "action": "pause"})
    assert status == 303
    assert all(cluster.stats(n, "csrf")["paused"] for n in cluster.nodes)  # type: ignore[index]


def test_pages_carry_a_content_security_policy_without_inline_script(
    cluster: Cluster, console_factory: Any, page: Any
) -> None:
    console = console_factory()
    response = page.goto(console.url("/"))
    headers = response.all_headers()
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert headers["x-frame-options"] == "DENY"
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    # An inline script injected into the page is blocked by the browser itself.
    blocked = page.evaluate("""() => new Promise(resolve => {
        document.addEventListener('securitypolicyviolation', e => resolve(e.violatedDirective));
        const s = document.createElement('script'); s.textContent = 'window.__ran = 1';
        document.body.appendChild(s);
        setTimeout(() => resolve(window.__ran ? 'ran' : 'no event'), 2000);
    })""")
    assert blocked.startswith("script-src")
