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

Each call resolves one :class:`Policy` at its start (:func:`resolve`), from the environment and from the cache or
URL in hand (:mod:`precompile.store.opening` reads a URL's options), and applies it to every path it takes: ``precompile.load("a.pc", cache="file:///c?verify_keys=...")``
refuses an unsigned file as the cache would refuse an unsigned entry.

The signature travels inside the manifest (its ``signature`` field), so it is stored, copied and exported with
it by every cache, both file formats and any bundle that copies refs and blobs.  It signs
``DOMAIN + canonical JSON of every other manifest field`` (sorted keys, no whitespace, ASCII), computed from the
parsed JSON, so any two writers of the same manifest agree on the bytes.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from dataclasses import dataclass, replace
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from precompile import config
from precompile.manifest.trust_keys import (  # the keys' API, re-exported: callers know it as trust.*
    MAX_KEY_FILE_BYTES,
    PUBLIC_PREFIX,
    generate_key,
    key_id,
    load_signing_key,
    parse_verify_keys,
    public_text,
)

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from precompile.manifest.manifest import Manifest

__all__ = ["DOMAIN", "MAX_KEY_FILE_BYTES", "PUBLIC_PREFIX", "REASONS", "Policy", "Verdict", "describe",
           "generate_key", "key_id", "load_signing_key", "note_refused", "parse_verify_keys", "policy",
           "public_text", "refused", "resolve", "signed_message"]

log = logging.getLogger("precompile")

#: Prefix of every signed message: a signature over a manifest can never be replayed as one over anything else.
DOMAIN = b"precompile manifest signature v1\n"
#: Why an artifact was refused (the counter is ``untrusted_<reason>``).
REASONS = ("unsigned", "unknown_key", "bad_signature", "malformed")

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


# ----------------------------------------------------------------------------------------------- policy
class Policy:
    """What one call (a load, a store, an import, a rebuild) trusts, resolved once at its start (:func:`policy`)
    and applied to every path it takes: a file, an unpacked directory, a bundle, a cache entry.

    Attributes:
        verify: ``{key id: public key}``; empty means nothing is checked.
        signer: the private key manifests are signed with when stored or saved, or None.
        no_host_code: only artifacts whose wrapper is stored as data may load (``PRECOMPILE_REQUIRE_NO_HOST_CODE``).
    """

    def __init__(self, verify: tuple[Ed25519PublicKey, ...] = (), signer: Ed25519PrivateKey | None = None,
                 no_host_code: bool = False):
        self.signer = signer
        self.no_host_code = no_host_code
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
    "record"``) is signed over :class:`~precompile.manifest.record_manifest.RecordManifest`'s fields; a manifest with
    another ``kind`` (a whole-function artifact's) over
    :class:`~precompile.manifest.function_manifest.FunctionManifest`'s, and any kind but ``"function"`` then fails its
    parse before anything of it is used.

    Raises:
        ValueError: the manifest holds a value JSON cannot carry (NaN).
    """
    from precompile.manifest.manifest import Manifest

    fields: tuple[str, ...] = Manifest._FIELDS
    if doc.get("kind") == "record":  # a record (precompile.manifest.record_manifest): its own fields, its kind among them
        from precompile.manifest.record_manifest import RecordManifest

        fields = RecordManifest._FIELDS
    elif doc.get("kind") is not None:  # a whole-function manifest: its own fields, its kind among them
        from precompile.manifest.function_manifest import FunctionManifest

        fields = FunctionManifest._FIELDS
    body = {k: doc[k] for k in fields if k in doc}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                               allow_nan=False).encode("ascii")


def policy() -> Policy:
    """The policy of a call that holds no cache: the environment's settings (:mod:`precompile.config`); see
    :func:`resolve`.  A call that works with a cache or a cache URL adds that URL's keys: it resolves its policy with
    :func:`precompile.store.opening.open_with_policy` (or ``policy_for``, which reads the URL without opening it).

    Raises:
        TrustConfigError / ConfigError: as :func:`resolve`.
    """
    return resolve()


def resolve(url_keys: Sequence[str] = (), url_signer: str | None = None) -> Policy:
    """The one policy of a call: verify keys from ``PRECOMPILE_VERIFY_KEYS`` and ``url_keys`` (the cache URL's
    ``verify_keys=`` entries, every tier's), the signing key ``url_signer`` (the URL's ``signing_key=``) or else
    ``PRECOMPILE_SIGNING_KEY``, and ``PRECOMPILE_REQUIRE_NO_HOST_CODE``.  Keys from either place protect every path
    of the call alike: files, unpacked directories, bundles, cache entries, rebuilds.

    Raises:
        TrustConfigError: a configured key cannot be read, or a setting that is given names no key
            (``PRECOMPILE_VERIFY_KEYS=","``, an empty key file, a blank ``PRECOMPILE_SIGNING_KEY``): verification is
            never turned off by a setting that looks like one.
        ConfigError: ``PRECOMPILE_REQUIRE_NO_HOST_CODE`` holds something other than 1/0 (true/false...).
    """
    verify: list[Ed25519PublicKey] = []
    env_text = config.verify_keys_text()
    if env_text is not None:
        verify.extend(parse_verify_keys(env_text, "PRECOMPILE_VERIFY_KEYS"))
    if url_keys:
        verify.extend(parse_verify_keys(",".join(url_keys), "verify_keys= of the cache URL"))
    env_signer = config.signing_key_path()  # first: a blank PRECOMPILE_SIGNING_KEY is an error whatever the URL says
    signer_path = url_signer or env_signer
    return Policy(tuple(verify), load_signing_key(signer_path) if signer_path is not None else None,
                  no_host_code=config.require_no_host_code())


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
