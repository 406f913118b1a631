"""Signed artifacts: who may put code into a shared cache (DESIGN.md, "Trust"; docs/format.md, "Trust").

A load runs what an artifact carries (the fast wrapper's source, ``.so`` files, the pickled engine payload, the
modules ``parts.fast`` names).  Digests catch accidents, not attackers: a blob is always valid for the name it
was written under, so anyone who can write the cache can plant a self-consistent artifact.  Signatures stop that:

- a builder holds an Ed25519 private key (``PRECOMPILE_SIGNING_KEY``, or ``signing_key=`` in the cache URL) and
  signs every manifest it stores or saves.  The manifest names every blob by its sha256, so the signature covers
  every byte a load reads;
- a serving worker holds only public keys, several during a rotation (``PRECOMPILE_VERIFY_KEYS``, or
  ``verify_keys=`` in the cache URL).  With at least one configured, an artifact that is unsigned, signed by
  another key or whose signature does not match is refused before anything of it runs: from a cache it is a miss
  counted under ``untrusted`` and ``untrusted_<reason>`` and logged, never backfilled into a near tier; from a
  file or directory it is an :class:`~precompile.errors.UntrustedArtifactError`;
- with no key configured, nothing is checked (as before signatures existed); a builder's signing key counts as a
  verify key of its own, so a builder never runs an entry it could not have signed itself.

The signature travels inside the manifest (its ``signature`` field), so it is stored, copied and exported with
it by every cache, both file formats and any bundle that copies refs and blobs.  It signs
``DOMAIN + canonical JSON of every other manifest field`` (sorted keys, no whitespace, ASCII), computed from the
parsed JSON, so any two writers of the same manifest agree on the bytes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precompile import config
from precompile.errors import TrustConfigError

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from cache_backends.base import Cache
    from precompile.artifact.manifest import Manifest

log = logging.getLogger("precompile")

#: Prefix of every signed message: a signature over a manifest can never be replayed as one over anything else.
DOMAIN = b"precompile manifest signature v1\n"
#: Why an artifact was refused (the counter is ``untrusted_<reason>``).
REASONS = ("unsigned", "unknown_key", "bad_signature", "malformed")
#: Textual form of a public key: this prefix and the raw 32-byte key in hex.
PUBLIC_PREFIX = "ed25519:"

#: Artifacts refused in this process, by reason (files and caches alike); ``precompile stats`` shows a cache's.
refused: Counter[str] = Counter()


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one manifest.

    Attributes:
        ok: it may be loaded (signed by a configured key, or no key is configured).
        status: ``"verified"``, ``"unchecked"`` (no key configured) or one of :data:`REASONS`.
        key_id: the signer's key id (16 hex), when the manifest names one.
        detail: a sentence for logs and errors.
    """

    ok: bool
    status: str
    key_id: str | None
    detail: str


# ------------------------------------------------------------------------------------------------- keys
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


@functools.lru_cache(maxsize=64)
def parse_verify_keys(text: str, setting: str = "the verify key setting") -> tuple[Ed25519PublicKey, ...]:
    """Public keys from a comma-separated list: ``ed25519:<64 hex>`` entries, or paths of files holding one PEM
    public key or ``ed25519:<64 hex>`` lines (one key a line; blank lines and lines starting with ``#`` are
    skipped).  Parsed once per distinct text.  A setting that is given must name a key: one that yields none
    (``","``, an empty file, a file of comments, ``/dev/null``) would turn verification off, so it is an error.

    Args:
        text: the setting's value.
        setting: where it comes from, for messages (``"PRECOMPILE_VERIFY_KEYS"``, ``"verify_keys= of <url>"``).

    Raises:
        TrustConfigError: an entry is neither; a file is not a readable regular file of at most
            :data:`MAX_KEY_FILE_BYTES`; a line of a file is not exactly one key; a key is not Ed25519; or the
            setting yields no key at all.
    """
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


@functools.lru_cache(maxsize=8)
def load_signing_key(path: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file ``path`` (PKCS#8, unencrypted: ``openssl genpkey -algorithm ed25519``
    or :func:`generate_key`).  Read once per path, as :func:`parse_verify_keys` reads key files (a regular file of
    at most :data:`MAX_KEY_FILE_BYTES`, opened without blocking).

    Raises:
        TrustConfigError: ``path`` is empty, or the file cannot be read or holds no unencrypted Ed25519 private key.
    """
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


# ----------------------------------------------------------------------------------------------- policy
class Policy:
    """The keys one load or store works with: verify keys (by id) and an optional signing key.

    Attributes:
        verify: ``{key id: public key}``; empty means nothing is checked.
        signer: the private key manifests are signed with when stored or saved, or None.
    """

    def __init__(self, verify: tuple[Ed25519PublicKey, ...] = (), signer: Ed25519PrivateKey | None = None):
        self.signer = signer
        keys = list(verify) + ([signer.public_key()] if signer is not None else [])
        self.verify = {key_id(k): k for k in keys}

    @property
    def required(self) -> bool:
        """True when a verify key is configured: then only artifacts signed by one of them load."""
        return bool(self.verify)

    def check(self, doc: dict[str, Any]) -> Verdict:
        """Check a parsed manifest's signature against the verify keys.  Never raises.

        Returns:
            a :class:`Verdict`; ``ok`` is True when no key is configured, whatever the manifest holds.
        """
        sig = doc.get("signature") if isinstance(doc, dict) else None
        kid = sig.get("key_id") if isinstance(sig, dict) and isinstance(sig.get("key_id"), str) else None
        if not self.required:
            return Verdict(True, "unchecked", kid, "no verify key is configured")
        if sig is None:
            return Verdict(False, "unsigned", None, "it is not signed")
        if not isinstance(sig, dict) or sig.get("alg") != "ed25519" or kid is None \
                or not isinstance(sig.get("value"), str):
            return Verdict(False, "malformed", kid, "its signature record is malformed")
        key = self.verify.get(kid)
        if key is None:
            return Verdict(False, "unknown_key", kid, f"it is signed by key {kid}, which is not a configured "
                                                      f"verify key ({', '.join(sorted(self.verify))})")
        try:
            value = base64.b64decode(sig["value"], validate=True)
            message = signed_message(doc)
        except ValueError as err:
            return Verdict(False, "malformed", kid, f"its signature or content cannot be checked ({err})")
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(value, message)
        except InvalidSignature:
            return Verdict(False, "bad_signature", kid, f"its signature by key {kid} does not match its content "
                                                        "(changed after signing)")
        return Verdict(True, "verified", kid, f"signed by key {kid}")

    def sign(self, manifest: Manifest) -> Manifest:
        """``manifest`` signed with :attr:`signer`; unchanged when there is no signer or it is signed already."""
        if self.signer is None or manifest.signature is not None:
            return manifest
        doc = json.loads(manifest.to_json())
        public = self.signer.public_key()
        value = self.signer.sign(signed_message(doc))
        return replace(manifest, signature={"alg": "ed25519", "key_id": key_id(public),
                                            "public_key": public_text(public),
                                            "value": base64.b64encode(value).decode("ascii")})


def signed_message(doc: dict[str, Any]) -> bytes:
    """The bytes a manifest's signature signs: :data:`DOMAIN` + canonical JSON of every manifest field but
    ``signature`` (fields a reader does not know are left out: it never uses them).  A record (``"kind":
    "record"``) is signed over :class:`~precompile.artifact.record_manifest.RecordManifest`'s fields; a manifest with
    another ``kind`` (a whole-function artifact's) over
    :class:`~precompile.artifact.function_manifest.FunctionManifest`'s, and any kind but ``"function"`` then fails its
    parse before anything of it is used.

    Raises:
        ValueError: the manifest holds a value JSON cannot carry (NaN).
    """
    from precompile.artifact.manifest import Manifest

    fields: tuple[str, ...] = Manifest._FIELDS
    if doc.get("kind") == "record":  # a record (precompile.artifact.record_manifest): its own fields, its kind among them
        from precompile.artifact.record_manifest import RecordManifest

        fields = RecordManifest._FIELDS
    elif doc.get("kind") is not None:  # a whole-function manifest: its own fields, its kind among them
        from precompile.artifact.function_manifest import FunctionManifest

        fields = FunctionManifest._FIELDS
    body = {k: doc[k] for k in fields if k in doc}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                               allow_nan=False).encode("ascii")


def policy(cache: Cache | None = None) -> Policy:
    """The policy of a load or store: the environment's keys (:mod:`precompile.config`) plus those of ``cache``'s
    URL (``verify_keys=``, ``signing_key=``, checked when the cache was opened).

    Raises:
        TrustConfigError: a configured key cannot be read, or a setting that is given names no key
            (``PRECOMPILE_VERIFY_KEYS=","``, an empty key file, a blank ``PRECOMPILE_SIGNING_KEY``): verification is
            never turned off by a setting that looks like one.
    """
    verify: list[Ed25519PublicKey] = []
    env_text = config.verify_keys_text()
    if env_text is not None:
        verify.extend(parse_verify_keys(env_text, "PRECOMPILE_VERIFY_KEYS"))
    url_keys = ",".join(getattr(cache, "verify_keys", ()) or ())
    if url_keys:
        verify.extend(parse_verify_keys(url_keys, "verify_keys= of the cache URL"))
    env_signer = config.signing_key_path()  # first: a blank PRECOMPILE_SIGNING_KEY is an error whatever the URL says
    signer_path = getattr(cache, "signing_key", None) or env_signer
    return Policy(tuple(verify), load_signing_key(signer_path) if signer_path is not None else None)


def note_refused(verdict: Verdict, what: str) -> dict[str, int]:
    """Log a refused artifact (a warning) and count it in :data:`refused`; returns the cache counters to add
    (``untrusted`` and ``untrusted_<reason>``)."""
    refused[verdict.status] += 1
    log.warning("refusing %s: %s; nothing of it was run (verify keys: PRECOMPILE_VERIFY_KEYS / verify_keys=)",
                what, verdict.detail)
    return {"untrusted": 1, f"untrusted_{verdict.status}": 1}


def describe(doc: dict[str, Any], pol: Policy | None = None) -> str:
    """One line for ``precompile inspect``: who signed the manifest and whether that verifies here.  Every value
    read from the manifest is shown as ``repr`` text (it is cache content: print the line with markup off).

    Raises:
        TrustConfigError: ``pol`` is None and the configured keys cannot be read (as :func:`policy`): a key setting
            that is wrong is an error here too, never "not checked".
    """
    pol = pol or policy()
    sig = doc.get("signature")
    if sig is None:
        return "signature: none (unsigned)"
    if not isinstance(sig, dict):
        head = f"signature: malformed ({type(sig).__name__})"
    else:
        head = (f"signature: {_shown(sig.get('alg'))} key {_shown(sig.get('key_id'))} "
                f"({_shown(sig.get('public_key'))})")
    if not pol.required:
        return f"{head}; not checked (no verify key configured)"
    verdict = pol.check(doc)
    return f"{head}; {'verified' if verdict.ok else 'REFUSED: ' + verdict.detail}"


def _shown(value: Any) -> str:
    """A stored value for one line of text: a plain string as is (at most 100 characters), anything else as its
    ``repr`` (bounded too)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 100 else text[:97] + "..."
