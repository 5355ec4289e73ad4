"""Write-then-rename, so an interrupted run never leaves a valid-looking output.

The temporary is a hidden sibling ``.NAME.tmp-HOST-PID-XXXX``; each write of
``NAME`` first removes those that dead processes of this host left. A failed write
is a one-line :class:`SpdnnError` naming the output. A character device or FIFO
(``--out /dev/null``) is written directly: renaming over it would replace the
device. Anything else that is not a regular file is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from spdnn_mpi.errors import SpdnnError

#: Name of the staging folder :func:`atomic_tree` makes inside an existing folder.
STAGING = "spdnn-staging"
#: A temporary's name: ``.NAME.tmp-HOST-PID-XXXX`` (HOST as ``_host`` writes it).
_TEMPORARY = re.compile(r"^\.(.+)\.tmp-[A-Za-z0-9._]+-\d+-[A-Za-z0-9_]+$")


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
    """Remove the temporaries of ``final`` left by dead processes of this host (another
    node's PIDs say nothing here); return them."""
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


def shown_path(path: str | os.PathLike) -> Path:
    """``path`` as the user knows it: each temporary ``.NAME.tmp-HOST-PID-XXXX`` in it
    named ``NAME`` (a staging folder of :func:`atomic_tree` left out)."""
    parts = []
    for part in Path(path).parts:
        m = _TEMPORARY.match(part)
        if m and m.group(1) == STAGING:
            continue
        parts.append(m.group(1) if m else part)
    return Path(*parts) if parts else Path(path)


def write_error(final: str | os.PathLike, exc: BaseException) -> SpdnnError:
    """A one-line SpdnnError for a failed write of ``final`` (errno text when there is
    one), naming ``final`` as the user knows it (:func:`shown_path`)."""
    final = shown_path(final)
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


def stream_target(path: str | os.PathLike) -> bool:
    """True when ``path`` is a character device or a FIFO: written directly, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _check_target(final: Path, directory: bool, stream: bool) -> None:
    """Refuse an existing ``final`` of a kind this write cannot replace or write through."""
    from spdnn_mpi.util.outputs import file_kind

    try:
        mode = os.stat(final).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or (stream and not directory
                                                     and stream_target(final)):
        return
    raise SpdnnError(f"cannot write {final}: it is {file_kind(mode)}, not a regular file")


@contextlib.contextmanager
def _written_through(final: Path) -> Iterator[Path]:
    """Yield ``final`` itself (a device or FIFO); a failed write is a one-line error."""
    try:
        yield final
    except OSError as exc:
        if _about_output(exc, (final,)):
            raise write_error(final, exc) from None
        raise


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and the folders missing above it; return those created, deepest first."""
    made = []
    p = folder
    while not p.exists() and not p.is_symlink() and p != p.parent:
        made.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove folders made for a write that failed, as long as they are empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


def temporary_prefix(final: str | os.PathLike) -> str:
    """The name prefix of this process's temporaries of ``final``: ``.NAME.tmp-HOST-PID-``.

    Anything made beside ``final`` under such a name (a scratch folder too) is
    removed by the next write of ``final`` once this process is dead.
    """
    return f".{Path(final).name}.tmp-{_host()}-{os.getpid()}-"


def _new_temporary(final: Path, directory: bool) -> tuple[Path, list[Path]]:
    """(a new temporary for ``final``, the folders made for it); stale ones removed first."""
    prefix = temporary_prefix(final)
    made: list[Path] = []
    try:
        made = _make_parents(final.parent)
        remove_stale_temporaries(final)
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as exc:
        _remove_made(made)
        raise write_error(final, exc) from None
    # mkstemp/mkdtemp create owner-only entries; give the usual umask-based modes
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)
    return tmp, made


@contextlib.contextmanager
def _dropped_on_failure(tmp: Path, made: list[Path], final: Path) -> Iterator[None]:
    """On any exception remove ``tmp`` (file or folder) and the folders made for it; an
    OSError of the write becomes a one-line SpdnnError naming ``final``."""
    try:
        yield
    except BaseException as exc:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        _remove_made(made)
        if isinstance(exc, OSError) and _about_output(exc, (tmp, final)):
            raise write_error(final, exc) from None
        raise


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, directory: bool = False,
                stream: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it onto ``final`` only on success
    (removed on any exception, KeyboardInterrupt too).

    With ``stream`` (files only), a character device or FIFO ``final`` is yielded
    itself; without it (an HDF5 store, which seeks) such a ``final`` is refused.
    """
    final = Path(final)
    _check_target(final, directory, stream)
    if stream and not directory and stream_target(final):
        with _written_through(final) as target:
            yield target
        return
    tmp, made = _new_temporary(final, directory)
    with _dropped_on_failure(tmp, made, final):
        yield tmp
        if directory and final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)


@contextlib.contextmanager
def atomic_tree(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder whose entries appear in ``final`` only on success.

    An existing ``final`` keeps what else it holds: the temporary is made inside it
    (``.spdnn-staging.tmp-HOST-PID-XXXX``) and its entries are renamed into place,
    each replacing one of its name.
    """
    final = Path(final)
    if not final.is_dir():
        with atomic_path(final, directory=True) as tmp:
            yield tmp
        return
    tmp, made = _new_temporary(final / STAGING, directory=True)
    with _dropped_on_failure(tmp, made, final):
        yield tmp
        for entry in sorted(tmp.iterdir(), key=lambda p: p.lstat().st_mtime_ns):
            target = final / entry.name
            if target.is_dir() and not target.is_symlink():
                target.rename(tmp / f".replaced-{entry.name}")  # dropped with the staging
            os.replace(entry, target)
        shutil.rmtree(tmp)


def write_text_atomic(final: str | os.PathLike, text: str) -> None:
    """Write a whole text file atomically."""
    with atomic_path(final) as tmp:
        tmp.write_text(text)
