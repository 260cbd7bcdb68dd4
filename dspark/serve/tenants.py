"""Who is asking, and which namespace of the shared state their request may use.

A server has keys, each belonging to a tenant: one key per tenant from `--api-key`
(named `key-1`, `key-2`, ... in the order given), or any mapping of keys to tenant
names from `--api-keys-file` (several keys may share a tenant, e.g. while one is
rotated). A request's namespace is a keyed hash of its tenant and its `cache_salt`
(vLLM's body field, or the `X-Cache-Salt` header, which wins). The engine keys the
prefix cache and the reply history by it, so that how fast a request runs depends on
its own namespace's earlier text alone.

On a server with at most one tenant, requests without a salt share the namespace
None, as in vLLM; that path costs one key comparison and no hashing. With two
tenants or more every request's namespace includes its tenant, so a tenant that
sends another's salt lands in a namespace of its own.

Only the hash is kept: the hash key is drawn at start-up and never leaves the
process, so the hashes (which nothing exposes anyway) cannot be matched against
guessed salts, and the raw salt reaches no log, metric or page.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dspark.errors import UserError

#: long enough for any identifier, short enough that hashing it costs nothing worth measuring
MAX_SALT_CHARS = 1024
SALT_HEADER = "x-cache-salt"
SALT_FIELD = "cache_salt"
#: the tenant of a server without keys (its requests are anyone's)
OPEN_TENANT = ""


def keys_from_args(api_keys: list[str] | None, keys_file: str | None) -> dict[str, str]:
    """key -> tenant from `--api-key` (each its own tenant) and `--api-keys-file`; a
    clear UserError for an empty or repeated key or a malformed file."""
    keys: dict[str, str] = {}
    for i, key in enumerate(api_keys or [], 1):
        _add_key(keys, key, f"key-{i}", "--api-key")
    if keys_file is not None:
        for key, tenant in read_keys_file(keys_file).items():
            _add_key(keys, key, tenant, f"--api-keys-file {keys_file}")
    return keys


def read_keys_file(path: str) -> dict[str, str]:
    """A keys file: one `KEY TENANT` a line (blank lines and `#` comments skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--api-keys-file: cannot read {path}: {e}") from None
    keys: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[1].strip():
            raise UserError(f"--api-keys-file {path}, line {n}: expected 'KEY TENANT' (a key, a space, a tenant "
                            "name); the key itself is not shown")
        _add_key(keys, parts[0], parts[1].strip(), f"--api-keys-file {path}, line {n}")
    if not keys:
        raise UserError(f"--api-keys-file {path} holds no keys; one 'KEY TENANT' a line")
    return keys


def _add_key(keys: dict[str, str], key: str, tenant: str, where: str) -> None:
    if not key or not key.strip() or key != key.strip():
        raise UserError(f"{where}: a key must be non-empty and without surrounding spaces")
    if key in keys:
        raise UserError(f"{where}: a key is given twice (tenants {keys[key]!r} and {tenant!r})")
    keys[key] = tenant


@dataclass
class Tenants:
    """The keys a server accepts and the namespaces of its requests."""

    keys: Mapping[str, str] = field(default_factory=dict)  # key -> tenant

    def __post_init__(self) -> None:
        # digests of one length: comparing them takes the same time whatever the key's length
        self._digests = [(hashlib.sha256(k.encode()).digest(), t) for k, t in self.keys.items()]
        self._hash_key = secrets.token_bytes(32)
        self.tenants = sorted(set(self.keys.values()))

    @property
    def required(self) -> bool:
        return bool(self.keys)

    @property
    def shared(self) -> bool:
        """True when requests without a salt share one namespace (at most one tenant)."""
        return len(self.tenants) <= 1

    def authenticate(self, authorization: str) -> str:
        """The tenant of an `Authorization: Bearer KEY` header (OPEN_TENANT on a server
        without keys); a 401 APIError otherwise. Every key is compared, in constant time,
        whichever matches."""
        if not self._digests:
            return OPEN_TENANT
        scheme, _, token = authorization.partition(" ")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found = None
        for key_digest, tenant in self._digests:
            if hmac.compare_digest(digest, key_digest) and scheme.lower() == "bearer":
                found = tenant
        if found is None:
            from .protocol import APIError  # torch-free at import: `dspark bench` builds this CLI

            raise APIError(401, "invalid or missing API key; send the header 'Authorization: Bearer <key>'",
                           "authentication_error", None, "invalid_api_key")
        return found

    def namespace(self, tenant: str, salt: str | None) -> str | None:
        """The namespace of a request of `tenant` with `salt` (None: the shared one, for
        requests without a salt on a server of at most one tenant)."""
        if salt is None and self.shared:
            return None
        h = hashlib.blake2b(key=self._hash_key, digest_size=16)
        h.update(tenant.encode())
        h.update(b"\0" if salt is None else b"\1" + salt.encode())
        return h.hexdigest()


def cache_salt(body: Mapping, headers: Mapping[str, str]) -> str | None:
    """The request's salt: the `X-Cache-Salt` header, else the body's `cache_salt`; None
    without either. A 400 for one that is not a non-empty string of at most
    MAX_SALT_CHARS characters (the message never repeats it)."""
    header = headers.get(SALT_HEADER)
    if header is not None:
        return _checked(header, SALT_HEADER)
    salt = body.get(SALT_FIELD)
    return None if salt is None else _checked(salt, SALT_FIELD)


def _checked(salt: object, where: str) -> str:
    from .protocol import bad_request  # torch-free at import: `dspark bench` builds this CLI

    if not isinstance(salt, str):
        raise bad_request(f"'{where}' must be a string (non-empty, at most {MAX_SALT_CHARS} characters), "
                          f"got {type(salt).__name__}", SALT_FIELD, "invalid_cache_salt")
    if not salt or len(salt) > MAX_SALT_CHARS:
        raise bad_request(f"'{where}' must be a non-empty string of at most {MAX_SALT_CHARS} characters, "
                          f"got {len(salt)} characters", SALT_FIELD, "invalid_cache_salt")
    return salt
