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

Files that a changed checkpoint or runtime left behind are pruned: when a new file is
written, only the KEEP_PER_KEY most recently used files of the same checkpoint name and
precision stay (a load marks its file used), so two installs with different kernel
builds do not prepare again in turn, and the cache does not grow with every rebuild.

Set DSPARK_NO_PREPARED=1 to neither read nor write these files.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

import torch

#: bump when what is stored changes meaning (fusion order, names, panel layout)
LAYOUT_VERSION = 1
#: checkpoints smaller than this are converted at each load instead
MIN_BYTES = 32 << 20
PANELS = ".panels"
#: prepared files kept per checkpoint name and precision (the most recently used)
KEEP_PER_KEY = 2


def _source_files(src: Path) -> list[Path]:
    return sorted(src.glob("*.safetensors")) + [src / "config.json"]


def prepared_path(src: Path, precision: str) -> Path | None:
    """Where the prepared form of checkpoint `src` at `precision` lives; None where it
    is not cached (switched off, small or unreadable checkpoint)."""
    from .cache import cache_root

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
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception:  # truncated or corrupt: prepare again, overwriting it
        return None
    try:
        os.utime(path)  # used now: the last to be pruned
    except OSError:
        pass
    return tensors


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
        prune(path)
    except (OSError, RuntimeError) as e:
        print(f"[dspark] could not cache the prepared model in {path.parent}: {e}", file=sys.stderr)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def prune(path: Path, keep: int = KEEP_PER_KEY) -> list[Path]:
    """Delete the prepared files of `path`'s checkpoint name and precision beyond the
    `keep` most recently used (`path` itself is always kept). A process that maps a
    deleted file keeps reading it (the bytes stay until it unmaps them). Returns
    what was deleted."""
    m = re.fullmatch(r"(.+-[a-z0-9]+)-[0-9a-f]{12}\.safetensors", path.name)
    if m is None:
        return []
    same = re.compile(re.escape(m.group(1)) + r"-[0-9a-f]{12}\.safetensors")
    try:
        files = [f for f in path.parent.iterdir() if same.fullmatch(f.name) and f != path]
        files.sort(key=lambda f: f.stat().st_mtime, reverse=True)
    except OSError:
        return []
    gone, freed = [], 0
    for f in files[max(keep - 1, 0):]:
        try:
            size = f.stat().st_size
            f.unlink()
        except OSError:
            continue
        gone.append(f)
        freed += size
    if gone:
        print(f"[dspark] removed {len(gone)} older prepared file(s) of {m.group(1)} "
              f"({freed / 2**30:.1f} GiB) from {path.parent}", file=sys.stderr)
    return gone
