"""Write-then-rename, so an interrupted run never leaves a valid-looking output.

The temporary is a hidden sibling ``.NAME.tmp-HOST-PID-XXXX``; a process
killed while writing (kill -9, a node crash) cannot remove its own, so each
new write of ``NAME`` first removes the temporaries of ``NAME`` left by dead
processes of this host. A failed write (disk full, no permission, a
read-only file system) is a one-line :class:`SpdnnError` naming the output.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from spdnn_mpi.errors import SpdnnError


def _host() -> str:
    """This host's name, safe inside a file name."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temporaries(final: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of ``final`` left by dead processes of this host; return them.

    Only names made by :func:`atomic_path` on this host are touched: the PID
    of a temporary from another node (a shared file system) says nothing here.
    """
    final = Path(final)
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.tmp-{re.escape(_host())}-(\d+)-")
    removed = []
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed


def write_error(final: str | os.PathLike, exc: BaseException) -> SpdnnError:
    """A one-line SpdnnError for a failed write of ``final`` (errno text when there is one)."""
    text = str(exc)
    m = re.search(r"error message = '([^']*)'", text)  # HDF5's wording of a failed write
    if getattr(exc, "errno", None):
        reason = os.strerror(exc.errno)
    elif m:
        reason = m.group(1)
    else:
        reason = (text.splitlines() or [type(exc).__name__])[0][:200]
    return SpdnnError(f"cannot write {final}: {reason}")


def _about_output(exc: OSError, paths: tuple[Path, ...]) -> bool:
    """True when ``exc`` is a write failure of the output, not an error reading an input."""
    if exc.filename is None:
        return True
    name = Path(os.fsdecode(exc.filename))
    return any(name == p or p in name.parents for p in paths)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it onto ``final`` only on success.

    The temporary lives in the same directory so the rename is atomic on POSIX
    file systems. On any exception (also KeyboardInterrupt) it is removed; an
    OSError of the write becomes a one-line SpdnnError naming ``final``.
    """
    final = Path(final)
    prefix = f".{final.name}.tmp-{_host()}-{os.getpid()}-"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(final)
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as exc:
        raise write_error(final, exc) from None
    # mkstemp/mkdtemp create owner-only entries; give the usual umask-based modes
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)
    try:
        yield tmp
        if directory and final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as exc:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if isinstance(exc, OSError) and _about_output(exc, (tmp, final)):
            raise write_error(final, exc) from None
        raise


def write_text_atomic(final: str | os.PathLike, text: str) -> None:
    """Write a whole text file atomically."""
    with atomic_path(final) as tmp:
        tmp.write_text(text)
