"""The token gate: an ASGI middleware in front of everything the console serves (pages, NiceGUI's static files,
socket.io's polling and websocket).

A request passes with the token (`?token=` in the URL, or `Authorization: token ...`) or with the cookie the first
tokened visit sets; a page visited with `?token=` is sent on to the same address without it, so the token does not
stay in the address bar or the browser's history. Anything else is refused: 401 for HTTP, 403 at a websocket's
handshake. The Host header must name the console's own loopback address (a DNS-rebinding page cannot use it), and a
request that carries an Origin must come from that address too (another site's page cannot open the websocket,
whatever cookies the browser would send).
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

REFUSED = b"the console needs its token: open the URL that `console` printed (its token is in the state folder)"


def cookie_name(port: int) -> str:
    # cookies are shared by every port of a host: one name per console
    return f"ducklake-console-{port}"


class TokenGate:
    def __init__(self, app, *, token: str, port: int):
        self.app = app
        self.token = token
        self.port = port
        self.cookie = hmac.new(token.encode(), b"console-cookie", hashlib.sha256).hexdigest()
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.origins = {f"http://{h}" for h in self.hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if headers.get("host") not in self.hosts or (origin is not None and origin not in self.origins):
            await self._refuse(scope, send, 403, b"this console answers only at its own loopback address")
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if self._cookie_ok(headers.get("cookie", "")) or self._same(headers.get("authorization", ""), "token "):
            await self.app(scope, receive, send)
            return
        if given is not None and hmac.compare_digest(given, self.token):
            if scope["type"] == "http" and scope.get("method") == "GET":
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                await self._enter(send, scope.get("path", "/") + (f"?{rest}" if rest else ""))
                return
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, send, 401 if scope["type"] == "http" else 403, REFUSED)

    def _cookie_ok(self, header: str) -> bool:
        jar = SimpleCookie()
        try:
            jar.load(header)
        except Exception:  # noqa: BLE001 - a malformed cookie header is no cookie
            return False
        morsel = jar.get(cookie_name(self.port))
        return morsel is not None and hmac.compare_digest(morsel.value, self.cookie)

    def _same(self, header: str, prefix: str) -> bool:
        return header.startswith(prefix) and hmac.compare_digest(header[len(prefix) :].strip(), self.token)

    async def _enter(self, send, location: str) -> None:
        """The first tokened visit: the cookie, and the same page again without the token in its address."""
        cookie = f"{cookie_name(self.port)}={self.cookie}; Path=/; HttpOnly; SameSite=Strict"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("latin-1")),
                    (b"set-cookie", cookie.encode("latin-1")),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope, send, status: int, body: bytes) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
