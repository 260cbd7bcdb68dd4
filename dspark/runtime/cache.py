"""The one folder dspark caches into: converted models, prepared weights, compiled
kernels, precision picks and step-time tables, each in its own subfolder.

`DSPARK_CACHE` names it (default `$XDG_CACHE_HOME/dspark`, else `~/.cache/dspark`).
`DSPARK_CACHE_DIR`, which once named the kernels' cache alone, is still read when
`DSPARK_CACHE` is unset, so a setup that exported it keeps one cache.
A leaf: it imports nothing of dspark.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("DSPARK_CACHE") or os.environ.get("DSPARK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dspark"
    )
    return Path(base)
