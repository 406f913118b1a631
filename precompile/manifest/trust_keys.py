"""Keys for signed artifacts (:mod:`precompile.manifest.trust`): public keys' text form and ids, verify-key
settings and key files, the builder's PEM signing key, and making a new key pair.

Key files are read as untrusted input: a regular file of at most :data:`MAX_KEY_FILE_BYTES`, opened without
blocking (a FIFO never hangs the reader); a setting that names no key is a
:class:`~precompile.errors.TrustConfigError`, never verification switched off.  Parsed keys are cached per setting
and per state of its files (inode, size, times), so a key removed from a file is not trusted from the next use on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precompile.errors import TrustConfigError

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: Textual form of a public key: this prefix and the raw 32-byte key in hex.
PUBLIC_PREFIX = "ed25519:"


def public_text(key: Ed25519PublicKey) -> str:
    """``"ed25519:<64 hex>"``: the form ``PRECOMPILE_VERIFY_KEYS`` and ``verify_keys=`` take."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + raw.hex()


def key_id(key: Ed25519PublicKey) -> str:
    """A public key's id: the first 16 hex characters of the sha256 of its raw 32 bytes."""
    return hashlib.sha256(bytes.fromhex(public_text(key)[len(PUBLIC_PREFIX):])).hexdigest()[:16]


#: Largest key file read (a PEM key or a list of public keys is a few hundred bytes), bytes.
MAX_KEY_FILE_BYTES = 1 << 20

_PUBLIC_TEXT = re.compile(r"ed25519:[0-9a-fA-F]{64}")


def _stamp(path: str) -> tuple[int, ...] | None:
    """What changes when file ``path`` is replaced or rewritten (inode, device, size, modification and change
    times in ns); None when it cannot be stat'ed (then it is read, and fails, on every use)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def parse_verify_keys(text: str, setting: str = "the verify key setting") -> tuple[Ed25519PublicKey, ...]:
    """Public keys from a comma-separated list: ``ed25519:<64 hex>`` entries, or paths of files holding one PEM
    public key or ``ed25519:<64 hex>`` lines (one key a line; blank lines and lines starting with ``#`` are
    skipped).  Parsed once per distinct text and state of its key files: a key removed from a file (revoked) is
    no longer trusted from the next load on, without a restart.  A setting that is given must name a key: one
    that yields none (``","``, an empty file, a file of comments, ``/dev/null``) would turn verification off, so it
    is an error.

    Args:
        text: the setting's value.
        setting: where it comes from, for messages (``"PRECOMPILE_VERIFY_KEYS"``, ``"verify_keys= of <url>"``).

    Raises:
        TrustConfigError: an entry is neither; a file is not a readable regular file of at most
            :data:`MAX_KEY_FILE_BYTES`; a line of a file is not exactly one key; a key is not Ed25519; or the
            setting yields no key at all.
    """
    files = tuple(_stamp(e.strip()) for e in text.split(",") if e.strip() and not e.strip().startswith(PUBLIC_PREFIX))
    return _parse_verify_keys(text, setting, files)


@functools.lru_cache(maxsize=64)
def _parse_verify_keys(text: str, setting: str, stamps: tuple[Any, ...]) -> tuple[Ed25519PublicKey, ...]:
    """:func:`parse_verify_keys` for its key files in the state ``stamps`` (:func:`_stamp`)."""
    keys: list[Ed25519PublicKey] = []
    files = 0
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if entry.startswith(PUBLIC_PREFIX):
            keys.append(_public_from_text(entry, f"{setting}: verify key {entry[:24]!r}..."))
            continue
        data = _read_key_file(entry, f"{setting}: verify key file", " (a key is 'ed25519:<64 hex>' or a file of them)")
        keys.extend(_public_from_file(entry, data))
        files += 1
    if not keys:
        held = " (its key files hold no key)" if files else ""
        raise TrustConfigError(f"{setting} is set to {text[:80]!r}, which names no key{held}: give "
                               "'ed25519:<64 hex>' keys or files of them (comma-separated), or unset it to check "
                               "nothing")
    return tuple(keys)


def _read_key_file(path: str, what: str, hint: str = "") -> bytes:
    """The bytes of key file ``path``: a regular file of at most :data:`MAX_KEY_FILE_BYTES`, opened without
    blocking (a FIFO never hangs the reader).  ``what`` names the setting for messages.

    Raises:
        TrustConfigError: it does not exist, is not a regular file, is larger, or cannot be read.
    """
    from cache_backends.bounded import read_regular
    from precompile.errors import InputLimitError, NotRegularFileError

    try:
        return read_regular(Path(path).expanduser(), MAX_KEY_FILE_BYTES, what)
    except FileNotFoundError as err:
        raise TrustConfigError(f"{what} {path!r} does not exist{hint}") from err
    except (NotRegularFileError, InputLimitError) as err:  # their messages name the file
        raise TrustConfigError(str(err)) from err
    except OSError as err:  # EACCES, EIO...
        raise TrustConfigError(f"{what} {path!r} cannot be read: {err.strerror or err}") from err


def _public_from_text(text: str, where: str) -> Ed25519PublicKey:
    """The public key ``ed25519:<64 hex>`` (exactly that, nothing around it).

    Raises:
        TrustConfigError: ``text`` is anything else, or not a valid Ed25519 public key.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not _PUBLIC_TEXT.fullmatch(text):
        raise TrustConfigError(f"{where} is not 'ed25519:' followed by exactly 64 hex characters")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text[len(PUBLIC_PREFIX):]))
    except ValueError as err:
        raise TrustConfigError(f"{where} is not a valid Ed25519 public key: {err}") from err


def _public_from_file(path: str, data: bytes) -> list[Ed25519PublicKey]:
    """The keys of a key file's bytes: one PEM public key (alone in the file), or ``ed25519:<64 hex>`` lines.

    Raises:
        TrustConfigError: the file holds more than one PEM block or anything beside its one block, the PEM key does
            not load or is not Ed25519, or a line is not blank, a comment or
            exactly one key (the message names the file and the line).
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if b"-----BEGIN" in data:
        body = data.strip()
        if data.count(b"-----BEGIN") != 1 or not body.startswith(b"-----BEGIN") or not body.endswith(b"-----"):
            # load_pem_public_key reads the first block and ignores the rest: a second key or a stray line would be
            # dropped without a word
            raise TrustConfigError(f"verify key file {path} must hold exactly one PEM public key and nothing else, "
                                   "or 'ed25519:<64 hex>' lines; give each further PEM key its own file")
        try:
            key = load_pem_public_key(data)
        except (ValueError, TypeError) as err:
            raise TrustConfigError(f"verify key file {path} holds no readable PEM public key: {err}") from err
        if not isinstance(key, Ed25519PublicKey):
            raise TrustConfigError(f"verify key file {path} holds a {type(key).__name__}, not an Ed25519 key")
        return [key]
    keys = []
    for number, line in enumerate(data.decode("ascii", "replace").splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(_public_from_text(line, f"verify key file {path}, line {number}"))
    return keys


def load_signing_key(path: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file ``path`` (PKCS#8, unencrypted: ``openssl genpkey -algorithm ed25519``
    or :func:`generate_key`).  Read once per path and state of the file (a rotated key is used from the next store
    on), as :func:`parse_verify_keys` reads key files (a regular file of at most :data:`MAX_KEY_FILE_BYTES`, opened
    without blocking).

    Raises:
        TrustConfigError: ``path`` is empty, or the file cannot be read or holds no unencrypted Ed25519 private key.
    """
    return _load_signing_key(path, _stamp(path) if path.strip() else None)


@functools.lru_cache(maxsize=8)
def _load_signing_key(path: str, stamp: Any) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if not path.strip():
        raise TrustConfigError(f"signing key path {path!r} is empty: give a PEM private key's path, or leave the "
                               "setting out to sign nothing")
    data = _read_key_file(path, "signing key")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise TrustConfigError(f"signing key {path} cannot be read as an unencrypted PEM private key: {err}") from err
    if not isinstance(key, Ed25519PrivateKey):
        raise TrustConfigError(f"signing key {path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def generate_key(path: str | os.PathLike[str]) -> str:
    """Write a new Ed25519 private key to ``path`` (PEM, PKCS#8, mode 0600) and return its public key's text
    (``ed25519:<hex>``) for the serving workers' ``PRECOMPILE_VERIFY_KEYS``.

    Raises:
        FileExistsError: ``path`` exists (a key is never overwritten).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return public_text(key.public_key())
