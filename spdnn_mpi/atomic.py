"""Write-then-rename, so an interrupted run never leaves a valid-looking output."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it onto ``final`` only on success.

    The temporary lives in the same directory so the rename is atomic on POSIX
    file systems. On any exception (also KeyboardInterrupt) it is removed.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-{os.getpid()}-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    # mkstemp/mkdtemp create owner-only entries; give the usual umask-based modes
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)
    try:
        yield tmp
        if directory and final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise


def write_text_atomic(final: str | os.PathLike, text: str) -> None:
    """Write a whole text file atomically."""
    with atomic_path(final) as tmp:
        tmp.write_text(text)
