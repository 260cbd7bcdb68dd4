"""Exception types that signal a user mistake (bad path, bad value, too long a prompt).

The CLI prints these as one line; the server maps them to HTTP 400."""

from __future__ import annotations

from .data.sources import DataError
from .drafters.checkpoint import DrafterCheckpointError
from .drafters.config import DrafterConfigError
from .runtime.config import ConfigError
from .runtime.default_model import DefaultModelUnavailable
from .runtime.kv_cache import ContextTooLong
from .runtime.loader import ModelLoadError
from .sampling import SamplingError
from .schedule.step_time import ScheduleError

class UserError(Exception):
    """A mistake the user can fix; the CLI prints it as one line (exit status 2)."""


USER_ERRORS: tuple[type[Exception], ...] = (
    UserError,
    ConfigError,
    DefaultModelUnavailable,
    ContextTooLong,
    ModelLoadError,
    SamplingError,
    DrafterConfigError,
    DrafterCheckpointError,
    ScheduleError,
    DataError,
)
