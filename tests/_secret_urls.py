"""Cache URLs that carry secrets, and a real redis-server whose passwords they are (issue 39, part 3).

:func:`start_secured` starts one redis-server with a TLS port, a plain port and a unix socket: ``requirepass`` on
the default user, an ACL user per URL form (each with its own password), and TLS client certificates whose key
file is encrypted with a pass phrase (``--tls-auth-clients optional``: a client that presents a certificate is
checked), so that a URL's password and ``ssl_password`` are the ones that let it in.  :func:`forms` is the table of
URL forms, each with distinctive secrets that must never be printed: the forms a probe found echoed, the ways a
URL is mistyped, and tiered URLs whose remote part holds secrets.  ``outcome`` says what opening and using it does
(``"works"``, ``"fails on use"``: opened, then refused by the server or unreachable, ``"refused"``: the open
raises), so that a test can tell it checked what it meant to.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from _redis import RedisServer, free_port

#: The default user's password (``requirepass``) and the pass phrase of the client's TLS key file.
DEFAULT_PW = "dflt-Pw-4e91c"
SSL_PW = "tls-Phrase-b7d2"
#: The ACL users of the server and their passwords: each form that works its own.
USERS = {"tlsuser": "tls-user-Pw-31a7", "plainuser": "plain-Pw-c0ffee", "pctuser": "p@ct/Pw?#-9d4e",
         "atuser": "at-Pw-1f2e@second-half-77b1", "fraguser": "frag-user-Pw-5a5a", "tieruser": "tier-Pw-a3c3",
         "sockuser": "sock-Pw-6b01"}


@dataclass(frozen=True)
class Form:
    """One URL form: its ``name``, the ``url``, the ``secrets`` it carries, and its ``outcome`` (module docstring)."""

    name: str
    url: str
    secrets: tuple[str, ...]
    outcome: str


@dataclass
class Secured:
    """The server of :func:`start_secured` and what a URL needs to reach it."""

    server: RedisServer
    plain: int
    tls: int
    sock: Path
    ca: Path
    cert: Path
    key: Path

    def admin(self):
        """A client of the default user on the plain port."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.plain, password=DEFAULT_PW, socket_timeout=5)

    def tls_options(self, password: str = SSL_PW) -> str:
        """The query options of a ``rediss://`` URL that presents the client certificate (its key's pass phrase
        ``password``)."""
        return (f"ssl_ca_certs={self.ca}&ssl_certfile={self.cert}&ssl_keyfile={self.key}"
                f"&ssl_password={quote(password, safe='')}")


def start_secured(workdir: Path) -> Secured:
    """Start the server (see module docstring); stop it with ``secured.server.stop()``."""
    plain = free_port()
    server = RedisServer(workdir, "--port", str(plain), "--tls-auth-clients", "optional", tls=True).start()
    files = {name: workdir / f"{name}.pem" for name in ("ca", "ca_key")}
    key, csr, cert = workdir / "client_key.pem", workdir / "client.csr", workdir / "client.pem"
    run = lambda *args: subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)  # noqa: E731
    run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256", "-pass", f"pass:{SSL_PW}",
        "-out", key)
    run("req", "-new", "-key", key, "-passin", f"pass:{SSL_PW}", "-subj", "/CN=precompile-test-client", "-out", csr)
    run("x509", "-req", "-in", csr, "-CA", files["ca"], "-CAkey", files["ca_key"], "-CAcreateserial", "-days", "2",
        "-out", cert)
    secured = Secured(server, plain, server.port, server.sock, files["ca"], cert, key)
    server.client().config_set("requirepass", DEFAULT_PW)
    for name, password in USERS.items():
        secured.admin().execute_command("ACL", "SETUSER", name, "on", f">{password}", "~*", "&*", "+@all")
    return secured


#: Where :func:`forms` points without a server (for the names of the forms, when tests are collected).
NOWHERE = Secured(None, 1, 2, Path("/nonexistent/sock"), Path("/ca"), Path("/cert"),  # type: ignore[arg-type]
                  Path("/key"))


def names() -> list[str]:
    """The names of the forms, in order (test ids)."""
    return [f.name for f in forms(NOWHERE, Path("/nonexistent"))]


def forms(secured: Secured, tmp: Path) -> list[Form]:
    """The table of URL forms (module docstring) for the server ``secured``; ``tmp/near`` is made for the local
    tiers (not for :data:`NOWHERE`)."""
    host = f"127.0.0.1:{secured.plain}"
    tls = f"127.0.0.1:{secured.tls}"
    near = tmp / "near"
    users = USERS
    out = [
        # the probe's four: ssl_password, an unknown password option, userinfo in nodes=, a URL without a host
        Form("rediss+ssl_password", f"rediss://tlsuser:{users['tlsuser']}@{tls}/0?{secured.tls_options()}",
             (users["tlsuser"], SSL_PW), "works"),
        Form("password option", f"redis://{host}/0?password=opt-Pw-8c21e", ("opt-Pw-8c21e",), "refused"),
        Form("nodes userinfo", f"redis://{host}/?cluster=1&nodes=bob:nodes-Pw-42d7@{host}", ("nodes-Pw-42d7",),
             "refused"),
        Form("no host", "redis://alice:hostless-Pw-0b9e@/0", ("hostless-Pw-0b9e",), "refused"),
        # well-formed passwords, as they must be written
        Form("userinfo", f"redis://plainuser:{users['plainuser']}@{host}/0", (users["plainuser"],), "works"),
        Form("default user", f"redis://:{DEFAULT_PW}@{host}/0?prefix=dflt", (DEFAULT_PW,), "works"),
        Form("percent-encoded", f"redis://pctuser:{quote(users['pctuser'], safe='')}@{host}/0",
             (users["pctuser"], quote(users["pctuser"], safe=""), "ct/Pw?#-9d4e"), "works"),
        Form("@ in the password", f"redis://atuser:{users['atuser']}@{host}/0", (users["atuser"], "second-half-77b1"),
             "works"),
        Form("unix socket", f"unix://sockuser:{users['sockuser']}@{secured.sock}?db=0", (users["sockuser"],),
             "works"),
        Form("fragment", f"redis://fraguser:{users['fraguser']}@{host}/0#frag-Secret-e1e1",
             (users["fraguser"], "frag-Secret-e1e1"), "works"),
        # mistyped
        Form("no scheme", f"alice:noscheme-Pw-3d3d@{host}/0", ("noscheme-Pw-3d3d",), "refused"),
        Form("one slash", f"redis:/alice:oneslash-Pw-7e7e@{host}/0", ("oneslash-Pw-7e7e",), "refused"),
        Form("empty host", "redis://:emptyhost-Pw-9f9f@", ("emptyhost-Pw-9f9f",), "refused"),
        Form("stray spaces", f"  redis://plainuser:spaced-Pw-2c2c @{host}/0 ", ("spaced-Pw-2c2c",), "fails on use"),
        Form("slash in the password", f"redis://alice:slash-Pw-4a/second-4b4b@{host}/0",
             ("slash-Pw-4a", "second-4b4b"), "refused"),
        Form("two ?", f"redis://plainuser:twoq-Pw-5c5c@{host}/0?ttl=5?password=twoq-Opt-6d6d",
             ("twoq-Pw-5c5c", "twoq-Opt-6d6d"), "refused"),
        Form("semicolon", f"redis://plainuser:semi-Pw-8a8a@{host}/0;password=semi-Opt-8b8b",
             ("semi-Pw-8a8a", "semi-Opt-8b8b"), "fails on use"),
        Form("IPv6 host", f"redis://alice:ipv6-Pw-1a1a@[::1]:{secured.plain + 1}/0?timeout=1", ("ipv6-Pw-1a1a",),
             "fails on use"),
        Form("broken IPv6", f"redis://alice:brokenv6-Pw-2b2b@[::1:{secured.plain}/0", ("brokenv6-Pw-2b2b",),
             "refused"),
        Form("wrong password", f"redis://plainuser:wrong-Pw-3e3e@{host}/0", ("wrong-Pw-3e3e",), "fails on use"),
        Form("file password option", f"file://{near}?password=file-Pw-4f4f", ("file-Pw-4f4f",), "refused"),
        Form("inline signing key", f"file://{near}?signing_key=MC4CAQAwBQYDK2VwBCIEIsigning-Secret-5g5g",
             ("MC4CAQAwBQYDK2VwBCIEIsigning-Secret-5g5g",), "refused"),
        # tiered: the remote tier's secrets
        Form("tiered", f"file://{near}|rediss://tieruser:{users['tieruser']}@{tls}/0?{secured.tls_options()}",
             (users["tieruser"], SSL_PW), "works"),
        Form("tiered, ssl_password without TLS", f"file://{near}|redis://tieruser:tier2-Pw-6h6h@{host}/0"
             "?ssl_password=tier2-Ssl-7i7i", ("tier2-Pw-6h6h", "tier2-Ssl-7i7i"), "refused"),
        Form("tiered, three URLs", f"file://{near}|redis://tieruser:tier3-Pw-8j8j@{host}/0|redis://x/0",
             ("tier3-Pw-8j8j",), "refused"),
        Form("tiered, wrong remote password", f"file://{near}|redis://tieruser:tier4-Pw-9k9k@{host}/0",
             ("tier4-Pw-9k9k",), "fails on use"),
    ]
    if secured is not NOWHERE:
        near.mkdir(exist_ok=True)
    return out
