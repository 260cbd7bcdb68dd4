"""A checkpoint in the runtime's own layout, cached so a start maps it from disk.

The first load of a checkpoint at a precision fuses its projections (q/k/v, gate/up),
converts them to the precision's storage dtypes and, for bf16w and fp32 on a CPU, packs
them into the native kernel's panels; together that is most of a start-up. The result is written
once to `<cache>/prepared/` as safetensors; later starts map that file (no copy, no
conversion: the bytes are the ones the first start computed, so outputs are
identical). A file is keyed by the checkpoint's files (path, size, mtime), the
precision, this layout's version and, where the native kernels run, their build; a changed
checkpoint or runtime gets a new file. Small checkpoints (tests' tiny models) are not
cached: converting them is quicker than a file.

Set DSPARK_NO_PREPARED=1 to neither read nor write these files.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch

#: bump when what is stored changes meaning (fusion order, names, panel layout)
LAYOUT_VERSION = 1
#: checkpoints smaller than this are converted at each load instead
MIN_BYTES = 32 << 20
PANELS = ".panels"


def _source_files(src: Path) -> list[Path]:
    return sorted(src.glob("*.safetensors")) + [src / "config.json"]


def prepared_path(src: Path, precision: str) -> Path | None:
    """Where the prepared form of checkpoint `src` at `precision` lives; None where it
    is not cached (switched off, small or unreadable checkpoint)."""
    from .default_model import cache_root

    if os.environ.get("DSPARK_NO_PREPARED"):
        return None
    try:
        stats = [(f.resolve(), f.stat()) for f in _source_files(src)]
    except OSError:
        return None
    if sum(st.st_size for _, st in stats) < MIN_BYTES:
        return None
    ident = "|".join(f"{f}:{st.st_size}:{st.st_mtime_ns}" for f, st in stats)
    from . import cpu_kernels

    if precision in ("bf16w", "bf16x", "fp32") and cpu_kernels.available():  # packed for the native kernels
        ident += "|" + cpu_kernels.build_id()
    digest = hashlib.sha1(f"{ident}|{precision}|{LAYOUT_VERSION}".encode()).hexdigest()[:12]
    return cache_root() / "prepared" / f"{src.name}-{precision}-{digest}.safetensors"


def load_prepared(path: Path | None) -> dict[str, torch.Tensor] | None:
    """The tensors of a prepared file, mapped from disk; None where there is none or it
    cannot be read (then the caller converts the checkpoint again)."""
    if path is None or not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception:  # truncated or corrupt: prepare again, overwriting it
        return None


def save_prepared(path: Path | None, tensors: dict[str, torch.Tensor]) -> None:
    """Write `tensors` to `path` (aside, then renamed: a concurrent start never maps a
    half-written file). A failure (disk full, read-only cache) costs only speed."""
    if path is None:
        return
    from safetensors.torch import save_file

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=path.parent)
        os.close(fd)
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
        tmp = None
    except (OSError, RuntimeError) as e:
        print(f"[dspark] could not cache the prepared model in {path.parent}: {e}", file=sys.stderr)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
