"""Checks on a command's output paths, made before its long part starts: not one of
its inputs (never, even with --force), writable, and not an existing path unless
the rule lets it be replaced.

The rule: a *results file* (categories or predictions TSV, JSON report, plot) is
replaced without ``--force``, atomically; anything else (stores, TSV trees: hours
to make again) only with ``--force``. A command says which: ``results=True``, or
``force=`` its ``--force``.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from spdnn_mpi.errors import SpdnnError

PathLike = str | os.PathLike


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, from its ``st_mode``: "a FIFO", ..."""
    for test, words in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"


def same_path(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name the same file (also through links or ``..``)."""
    a, b = Path(a), Path(b)
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_output(
    path: PathLike,
    option: str,
    *,
    inputs: Mapping[str, PathLike | None] | None = None,
    results: bool = False,
    force: bool = False,
    directory: bool = False,
    regular: bool = False,
) -> Path:
    """Refuse ``path`` (given as ``option``) unless it may be written; returns it as a Path.

    ``inputs``: description ("the store") -> each input path of the command.
    ``results``/``force``: the module's rule. ``directory``: the output is a folder
    (an existing one is written into). An existing character device or FIFO is
    written directly, unless ``regular`` (a store: HDF5 seeks); other kinds are refused.
    """
    if str(path) == "-" and (regular or directory):
        what, name = ("a folder", "a folder") if directory else ("a store", "a file")
        raise SpdnnError(f"{option} -: {what} cannot go to standard output; name {name}")
    path = Path(path)
    for what, source in (inputs or {}).items():
        if source is not None and same_path(path, source):
            raise SpdnnError(f"{option} {path} is {what}: refusing to write over an input")
    if _check_special(path, option, regular or directory):
        return path
    if path.exists() or path.is_symlink():
        if path.is_dir() and not directory:
            raise SpdnnError(f"{option} {path} is a directory")
        if directory and not path.is_dir():
            raise SpdnnError(f"{option} {path} exists and is not a directory")
        if not (results or force or directory):
            raise SpdnnError(f"{option} {path} exists; pass --force to replace it")
    _check_writable(path, option)
    return path


def _is_char_device(path: PathLike) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _check_special(path: Path, option: str, regular: bool) -> bool:
    """True for an output written directly (a device or FIFO that may be opened for
    writing); refuses other kinds that are not regular files or folders."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return False
    if regular or not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise SpdnnError(f"{option} {path} is {file_kind(mode)}, not a regular file")
    if not os.access(path, os.W_OK):
        raise SpdnnError(f"{option} {path}: no permission to write")
    return True


def _check_writable(path: Path, option: str) -> None:
    """Create and remove a probe file where ``path``'s temporary will be made."""
    parent = path.parent
    existing = parent
    while not existing.exists():
        if existing == existing.parent:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise SpdnnError(f"{option} {path}: {existing} is not a directory")
    if existing != parent:  # atomic_path creates the missing folders
        if not os.access(existing, os.W_OK | os.X_OK):
            raise SpdnnError(f"{option} {path}: cannot create folders in {existing}")
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=parent)
    except OSError as exc:
        raise SpdnnError(f"{option} {path}: cannot write in {parent} "
                         f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def check_outputs(
    outputs: Mapping[str, PathLike | None],
    inputs: Mapping[str, PathLike | None] | None = None,
    *,
    results: bool = False,
    force: bool = False,
    regular: bool = False,
) -> None:
    """The one check of a command's outputs (option -> path, None: not given): no two
    the same file, each passing :func:`check_output`."""
    check_distinct(outputs)
    for option, path in outputs.items():
        if path is not None:
            check_output(path, option, inputs=inputs, results=results, force=force,
                         regular=regular)


def check_distinct(outputs: Mapping[str, PathLike | None]) -> None:
    """Refuse two options naming the same output file (one would overwrite the other);
    a character device (``/dev/null``) may take several."""
    given = [(k, v) for k, v in outputs.items() if v is not None]
    for i, (name_a, a) in enumerate(given):
        for name_b, b in given[i + 1 :]:
            if same_path(a, b) and not _is_char_device(a):
                raise SpdnnError(f"{name_a} and {name_b} are the same file {a}")


def _existing_folder(path: Path) -> Path:
    """``path`` if it is a folder, else the nearest existing folder above it."""
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_space(path: PathLike, need: int, option: str = "--out") -> None:
    """Refuse an output of about ``need`` bytes when its file system has less free."""
    from spdnn_mpi.util.memory import format_bytes

    path = Path(path)
    folder = _existing_folder(path)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # unknown: the write itself reports a full disk
    if need > free:
        raise SpdnnError(f"{option} {path}: needs about {format_bytes(need)} of disk, "
                         f"{format_bytes(free)} free in {folder}")

