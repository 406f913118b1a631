"""The one redaction of cache URLs: every cache URL precompile prints, logs, stores on a cache object or puts in an
error message or a metrics label goes through :func:`redact_url`.

A cache URL can carry secrets: the password of its user (``redis://user:PW@host``), TLS options
(``rediss://...?ssl_password=PW``, the pass phrase of the client's key file), the userinfo of a cluster's seed nodes
(``nodes=user:PW@host:port``), and whatever a user typed under a name precompile does not know (``?password=PW``,
``?pasword=PW``).  The opener keeps the URL as given to connect; what it shows is redacted.

What is shown, and why (each secret becomes ``***``):

- the userinfo password (``user:***@host``; a user name is shown: an ACL user is not a secret), found also in
  strings that do not parse or that urllib splits elsewhere: a password holding ``@``, ``/``, ``?`` or ``#``
  unencoded, a URL without a host (``redis://alice:PW@/0``), without a scheme (``alice:PW@host``), with one slash
  (``redis:/alice:PW@host``), with stray spaces, a broken IPv6 host.  Where the text is ambiguous the longer reading
  of the password is masked: a mistyped URL may show less of its host, never the secret.  A host's "port" that is
  not a number (``redis://alice:PW/0``: the ``@host`` forgotten) is masked too.
- a query option's value only where the option is in :data:`PUBLIC_OPTIONS` (checked one by one: numbers, flags,
  names, paths) and its name does not look like a secret's (:data:`SECRET_NAME`), or is one of
  :data:`KEY_NAMING` (``verify_keys`` holds public keys or key files; ``ssl_keyfile``, ``ssl_certfile`` name
  files); ``signing_key`` (a private key's *path*, :func:`precompile.manifest.trust_keys.load_signing_key`) is shown
  only when its value looks like a path, since an inline key is the secret itself.  Every other option's value is
  masked: an unknown option is an error anyway, which names the option; its value may be a secret under a misspelt
  name.  A query item without ``=`` that is not an option's name is masked whole.
- ``nodes=``: each entry's userinfo password, as for the URL's own.
- options are split on ``&``, ``;``, a second ``?`` and ``#`` (a fragment is read as options too):
  ``?ttl=5?password=PW`` masks ``PW``, where urllib would read ``5?password=PW`` as the value of ``ttl``.
- two URLs joined by ``|`` (a tiered cache), or a list of them, are redacted each; a ``|`` followed by something
  that does not start a URL is taken as part of a password.

:func:`url_secrets` lists the texts masked (raw, percent-decoded, and the pieces of a password that urllib would
split) so that :func:`scrub` can remove them from messages built elsewhere (an option parser's echo of its raw
value, a library's exception), and :func:`redacting` does so for every exception raised while a URL is opened
(its chain too: a traceback prints the causes).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from urllib.parse import unquote, unquote_plus

#: What a secret is shown as.
MASK = "***"

#: Query options whose values are public, shown as given (each backend's options, redis-py's URL options and the
#: TLS options it takes that name files or settings; sources: cache_backends/local/url.py and
#: cache_backends/redis/url.py ``URL_OPTIONS``, redis-py 8.1 ``redis.connection.URL_QUERY_ARGUMENT_PARSERS`` and
#: ``SSLConnection.__init__``).  ``ssl_password`` is not one.  tests/cache_backends/test_redaction.py checks that
#: every option of both backends is listed here.
PUBLIC_OPTIONS = frozenset({
    # file://
    "max_bytes", "read_only", "grace_s", "level", "fetch_wait",
    # redis:// (precompile's)
    "prefix", "ttl", "chunk_size", "cluster", "lease_ttl", "wait", "timeout", "down_s", "counters", "replica_reads",
    "retry_s", "nodes", "spread",
    # redis-py's
    "db", "health_check_interval", "legacy_responses", "max_connections", "protocol", "retry_on_error",
    "retry_on_timeout", "socket_connect_timeout", "socket_keepalive", "socket_read_size", "socket_timeout",
    "client_name", "ssl_check_hostname", "ssl_exclude_verify_flags", "ssl_include_verify_flags", "ssl_min_version",
    "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data", "ssl_certfile", "ssl_keyfile", "ssl_ciphers",
    "ssl_validate_ocsp", "ssl_validate_ocsp_stapled",
    # every backend's (cache_backends.registry.TRUST_OPTIONS)
    "verify_keys",
})
#: Option names that suggest a secret (password, passwd, pass phrase, pwd, secret, token, key, credential, auth,
#: private, cookie, session, signature): a value under such a name is masked unless the option is in
#: :data:`KEY_NAMING`.
SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|cred|auth|private|cookie|session|sig", re.IGNORECASE)
#: Public options whose names match :data:`SECRET_NAME` but whose values are not secrets: public keys or key files
#: (``verify_keys``), the paths of TLS files (``ssl_keyfile``, ``ssl_certfile``; the key file's pass phrase,
#: ``ssl_password``, is masked).
KEY_NAMING = frozenset({"verify_keys", "ssl_keyfile", "ssl_certfile"})
#: An option whose value is shown only when it looks like a path (a private key's file; an inline key is masked).
PATH_OPTIONS = frozenset({"signing_key"})
#: Options a backend takes whose values are secrets, always masked (redis-py's pass phrase of ``ssl_keyfile``).
SECRET_OPTIONS = frozenset({"ssl_password"})
#: Every option name a backend takes: an ``@`` in one's value is the value's (``client_name=me@host``); in anything
#: else after the host it may end a password that urllib cut short (:func:`misread_password`).
KNOWN_OPTIONS = PUBLIC_OPTIONS | PATH_OPTIONS | SECRET_OPTIONS

#: Secrets shorter than this are masked where a URL is shown, but not searched for in free text by :func:`scrub`
#: (replacing ``"0"`` in every message would garble it and hide nothing).
MIN_SCRUBBED = 3

_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\- ]*:")
_URL_START = re.compile(r"\s*(?:[A-Za-z][A-Za-z0-9+.\-]*:|/|~)")
_SEPARATORS = re.compile(r"([?&;#])")
_PATHLIKE = re.compile(r"^\s*(?:[/~.]|[A-Za-z]:\\)[^\s]*$|^[^\s]*\.(?:pem|key|der|p8)\s*$")


def redact_url(url: object) -> str:
    """``url`` (a cache URL, possibly mistyped; two joined by ``|``; a list of them; anything else as ``str``) with
    every secret replaced by ``***`` (module docstring).  Never raises; redacting a redacted URL changes nothing."""
    return _redact(url)[0]


def url_secrets(url: object) -> tuple[str, ...]:
    """The secrets :func:`redact_url` masks in ``url``, each as written and percent-decoded, with the pieces of a
    password that urllib would split at ``@``, ``/``, ``?``, ``#`` or ``:``; longest first."""
    return _redact(url)[1]


def misread_password(url: str) -> bool:
    """Whether urllib would cut ``url``'s password short: an ``@`` follows its netloc outside the value of an option
    a backend takes (in the path, a fragment, an unknown option), as when a password holds ``/``, ``?`` or ``#``
    unencoded (``redis://alice:pa/ss@host/0``: urllib reads host ``alice``, port ``pa``, path ``/ss@host/0``).  Such
    a URL is refused by the Redis opener: it would connect where its shown form does not say, and pieces of the
    password would show in the errors of that connection.  Never raises."""
    head, rest = _split_scheme(url)
    if head.strip().lower().startswith("file:") and rest.startswith("/"):
        return False  # a path, no userinfo
    return bool(_loose_ats(rest, len(re.split(r"[/?#]", rest, maxsplit=1)[0])))


def scrub(text: str, url: object) -> str:
    """``text`` with each secret of ``url`` (:func:`url_secrets`, those of :data:`MIN_SCRUBBED` characters or
    more) replaced by ``***`` where it is not part of a longer word (a masked fragment ``#frag`` leaves
    "fragment" alone): for messages not built from :func:`redact_url` (a parser's echo of a raw option, a
    library's exception)."""
    return _scrub(text, url_secrets(url))


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SCRUBBED and secret in text:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)
    return text


def scrub_error(err: BaseException, url: object) -> None:
    """Remove ``url``'s secrets (:func:`scrub`) from ``err`` and the exceptions it was raised from or during (its
    ``__cause__``/``__context__`` chain, at most 16 deep), in place: their string arguments, and an ``OSError``'s
    file names."""
    secrets = url_secrets(url)
    if not secrets:
        return
    seen: set[int] = set()
    stack: list[BaseException] = [err]
    while stack and len(seen) < 16:
        exc = stack.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        args = tuple(_scrub(a, secrets) if isinstance(a, str) else a for a in exc.args)
        if args != exc.args:
            exc.args = args
        if isinstance(exc, OSError):
            for name in ("filename", "filename2"):
                value = getattr(exc, name, None)
                if isinstance(value, str) and _scrub(value, secrets) != value:
                    setattr(exc, name, _scrub(value, secrets))
        stack.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)


@contextlib.contextmanager
def redacting(url: object) -> Iterator[None]:
    """Within it, an exception that escapes has ``url``'s secrets removed from its message and chain
    (:func:`scrub_error`) before it propagates: ``with redacting(url): open it``."""
    try:
        yield
    except BaseException as err:
        scrub_error(err, url)
        raise


# ------------------------------------------------------------------------------------------------ the parse
def _redact(url: object) -> tuple[str, tuple[str, ...]]:
    if isinstance(url, (list, tuple)):
        text = "|".join(str(u) for u in url)
    else:
        text = url if isinstance(url, str) else str(url)
    secrets: list[str] = []
    shown = "|".join(_one(piece, secrets) for piece in _tiers(text))
    found: set[str] = set()
    for s in secrets:
        for form in (s, unquote(s), unquote_plus(s), *re.split(r"[@/?#:]", s), *re.split(r"[@/?#:]", unquote(s))):
            for text in (form, form.strip()):
                if text and text != MASK:
                    found.add(text)
    return shown, tuple(sorted(found, key=lambda s: (-len(s), s)))


def _tiers(text: str) -> list[str]:
    """``text`` cut at each ``|`` that starts another URL (a scheme, ``/`` or ``~`` after it)."""
    pieces = text.split("|")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if _URL_START.match(piece) or not piece.strip():
            out.append(piece)
        else:
            out[-1] += "|" + piece
    return out


def _one(text: str, secrets: list[str]) -> str:
    """One URL, redacted; what was masked is appended to ``secrets``."""
    head, rest = _split_scheme(text)
    if head.strip().lower().startswith("file:") and rest.startswith("/"):
        return head + _tail(rest, secrets)  # a file:// path: no userinfo to look for
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    loose = _loose_ats(rest, len(netloc))
    if loose or _broken_ipv6(netloc):
        # urllib's netloc ends inside the password (it holds '/', '?', '#' or '@'), or the host does not parse:
        # the userinfo runs to the last '@' that is not in a public option's value, the longer reading of the
        # password
        at = loose[-1] if loose else netloc.rfind("@")
        if at >= 0:
            remainder = rest[at + 1:]
            hostport = re.split(r"[/?#]", remainder, maxsplit=1)[0]
            return (head + _userinfo(rest[:at], secrets) + "@" + _hostport(hostport, secrets)
                    + _tail(remainder[len(hostport):], secrets))
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        shown = _userinfo(userinfo, secrets) + "@" + _hostport(hostport, secrets)
    else:
        shown = _hostport(netloc, secrets)
    return head + shown + _tail(rest[len(netloc):], secrets)


def _loose_ats(rest: str, start: int) -> list[int]:
    """Positions in ``rest`` of each ``@`` after ``start`` (the end of urllib's netloc) that is in the path, in a
    fragment or query item that is not an option a backend takes (:data:`KNOWN_OPTIONS`): there, the ``@`` may end
    a password that held ``/?#``."""
    out = []
    split = re.search(r"[?#;]", rest[start:])
    query = start + split.start() if split else len(rest)
    out.extend(i for i in range(start, query) if rest[i] == "@")
    pos = query
    for token in _SEPARATORS.split(rest[query:]):
        if "@" in token and not _SEPARATORS.fullmatch(token):
            key = unquote_plus(token.partition("=")[0]).strip()
            if "=" not in token or key not in KNOWN_OPTIONS:
                out.extend(pos + i for i, c in enumerate(token) if c == "@")
        pos += len(token)
    return out


def _split_scheme(text: str) -> tuple[str, str]:
    """``(scheme and slashes as written, the rest)``; ``("", text)`` when there is no scheme."""
    i = text.find("://")
    if i >= 0 and not re.search(r"[/?@#]", text[:i]):
        return text[:i + 3], text[i + 3:]
    m = _SCHEME.match(text)
    if m and not re.search(r"[@?#]", m.group()):
        name = m.group()[:-1].strip().lower()
        after = text[m.end():]
        if after.startswith("/"):  # redis:/host, file:/dir
            slashes = len(after) - len(after.lstrip("/"))
            return text[:m.end() + slashes], after[slashes:]
        if name in ("redis", "rediss", "unix", "file"):  # redis:alice:PW@host
            return text[:m.end()], after
    stripped = text.lstrip()
    if stripped.startswith("//"):
        cut = len(text) - len(stripped) + 2
        return text[:cut], text[cut:]
    return "", text


def _broken_ipv6(netloc: str) -> bool:
    host = netloc.rpartition("@")[2]
    return ("[" in host) != ("]" in host)


def _userinfo(userinfo: str, secrets: list[str]) -> str:
    user, colon, password = userinfo.partition(":")
    if not colon:
        return userinfo
    if password:
        secrets.append(password)
    return f"{user}:{MASK}"


def _hostport(hostport: str, secrets: list[str]) -> str:
    """A host and port; a "port" that is not a number is masked (``alice:PW`` with its ``@host`` forgotten)."""
    host, colon, port = hostport.rpartition("]:") if hostport.lstrip().startswith("[") else hostport.rpartition(":")
    if not colon or not port or port.strip().isdigit():
        return hostport
    secrets.append(port)
    return f"{host}{colon}{MASK}"


def _tail(after: str, secrets: list[str]) -> str:
    """The path (shown) and the options after it (each redacted: :func:`_option`)."""
    split = re.search(r"[?#;]", after)  # redis://host/0;password=PW: urllib's "params" are options too
    start = split.start() if split else len(after)
    out = [after[:start]]
    for token in _SEPARATORS.split(after[start:]):
        out.append(token if _SEPARATORS.fullmatch(token) or not token else _option(token, secrets))
    return "".join(out)


def _option(item: str, secrets: list[str]) -> str:
    name, eq, value = item.partition("=")
    key = unquote_plus(name).strip()
    if not eq:
        if key in PUBLIC_OPTIONS or key in PATH_OPTIONS:
            return item
        secrets.append(item)
        return MASK
    if not value:
        return item
    if key == "nodes":
        return f"{name}={_nodes(value, secrets)}"
    if _public(key, value):
        return item
    secrets.append(value)
    return f"{name}={MASK}"


def _public(key: str, value: str) -> bool:
    if key in PATH_OPTIONS:
        text = unquote_plus(value)
        return bool(_PATHLIKE.match(text)) and "-----" not in text
    return key in PUBLIC_OPTIONS and (key in KEY_NAMING or not SECRET_NAME.search(key))


def _nodes(value: str, secrets: list[str]) -> str:
    """``host:port,...`` with each entry's userinfo password masked (the value percent-decoded first)."""
    text = unquote_plus(value) if "%" in value else value
    out = []
    for entry in text.split(","):
        if "@" in entry:
            userinfo, _, hostport = entry.rpartition("@")
            out.append(_userinfo(userinfo, secrets) + "@" + _hostport(hostport, secrets))
        else:
            out.append(_hostport(entry, secrets))
    return ",".join(out)

