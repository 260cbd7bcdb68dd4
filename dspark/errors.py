"""The base of every error that signals a user mistake (bad path, bad value, too long
a prompt). A leaf module: it imports nothing, so anything may import it.

Each domain error subclasses `UserError` where it lives (`DataError` in
`data/sources.py`, `ContextTooLong` in `runtime/kv_cache.py`, ...). The CLI prints a
`UserError` as one line (exit status 2); the server maps it to HTTP 400."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the CLI prints it as one line (exit status 2)."""


#: what callers catch as "the user's mistake" (every domain error subclasses UserError)
USER_ERRORS: tuple[type[Exception], ...] = (UserError,)
