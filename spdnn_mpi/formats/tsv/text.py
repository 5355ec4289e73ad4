"""The text of one TSV file, plain or gzipped, on disk or held in memory, cut into blocks.

``spdnn_mpi.formats.tsv.read`` parses what this module hands it: blocks of
bytes that end at a line break. A source is a path or a :class:`MemberText`
(a file's bytes already read, such as a member of a ``neuron{N}.tar.gz``
archive parsed in a worker process); gzip is recognised from the first
bytes, not the name. Damage is reported as an InputFormatError naming the
source (``archive.tar.gz[neuron1024/n1024-l3.tsv]`` for a member) and line.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import InputFormatError

_GZIP_ERRORS = (EOFError, OSError, zlib.error)


@dataclass(frozen=True)
class MemberText:
    """The bytes of a file read from somewhere else (an archive member), with the
    name its errors are reported under."""

    name: str
    data: bytes

    def __str__(self) -> str:
        return self.name


Source = str | os.PathLike | MemberText


def source_name(source: Source) -> str | Path:
    """What errors call ``source``: its path, or a member's ``archive[member]`` name."""
    return source.name if isinstance(source, MemberText) else Path(source)


def open_text(source: Source):
    """A binary file object over the (decompressed) text of ``source``."""
    if isinstance(source, MemberText):
        raw = io.BytesIO(source.data)
        return gzip.GzipFile(fileobj=raw, mode="rb") if source.data[:2] == b"\x1f\x8b" else raw
    path = Path(source)
    if not path.exists():
        raise InputFormatError(path, None, "no such file")
    if path.is_dir():
        raise InputFormatError(path, None, "is a directory, expected a file")
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rb") if gz else open(path, "rb")
    except OSError as exc:
        raise InputFormatError(path, None, f"cannot open: {exc.strerror or exc}") from None


def gzip_error(path, line: int, exc: BaseException, detail: str = "") -> InputFormatError:
    """A truncated or corrupt gzip stream, placed on the line where it showed."""
    what = "truncated" if isinstance(exc, EOFError) else "corrupt"
    return InputFormatError(
        path, line, f"{what} gzip data ({exc}){detail}; re-download or re-compress the file"
    )


def _failing_line(f: gzip.GzipFile) -> int:
    """The line on which the text of gzip file ``f`` stops decompressing: its complete
    lines before the failure, plus one. A block read fails as a whole, so the stream
    is read again from its start, member by member; only an error is reported this way."""
    raw = f.fileobj  # the compressed bytes: a file opened by path, or a member's BytesIO
    lines = 0
    try:
        raw.seek(0)
        unpack = zlib.decompressobj(wbits=31)
        while chunk := raw.read(1 << 20):
            while chunk:
                lines += unpack.decompress(chunk).count(b"\n")
                chunk = unpack.unused_data  # the next member's start, if any
                if unpack.eof:
                    unpack = zlib.decompressobj(wbits=31)
    except (OSError, zlib.error):
        pass  # where the data fails: lines holds what came before
    return lines + 1


def iter_text_blocks(f, path, block_bytes: int, lines_done: list[int]) -> Iterator[np.ndarray]:
    """Blocks of bytes from open file ``f`` ending at a line break (except the last).

    ``lines_done[0]``: the lines the caller has parsed so far, which places the error
    for a last line without a line break.
    """
    gz = isinstance(f, gzip.GzipFile)
    rest = b""
    while True:
        try:
            data = f.read(block_bytes)
        except _GZIP_ERRORS as exc:
            if gz:
                raise gzip_error(path, _failing_line(f), exc) from None
            raise InputFormatError(path, None, f"read error: {exc}") from None
        if not data:
            break
        if rest:
            data = rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        yield np.frombuffer(data, dtype=np.uint8, count=cut + 1)
        rest = data[cut + 1 :]
    if rest.strip(b" \t\r"):
        # A complete file ends with a line break; without one the last value may have
        # been cut (6.25e-02 -> 6.25 parses fine), so it is refused, never guessed.
        text = rest[:60].decode("utf-8", errors="replace")
        raise InputFormatError(
            path, lines_done[0] + 1,
            f"the last line has no line break, so the file may be cut short: {text!r} "
            "(if the file is complete, add a final newline)",
        )


def check_rest_of_gzip(f, path, problem: InputFormatError, block_bytes: int) -> None:
    """A bad line in a gzip file may be garbage from corrupt data: say so if it is.

    Corruption often decodes to plausible bytes until the CRC check at the
    end, so the rest of the stream is decompressed (and dropped) to find out.
    """
    if not isinstance(f, gzip.GzipFile):
        return
    try:
        while f.read(block_bytes):
            pass
    except _GZIP_ERRORS as exc:
        detail = f"; the first bad line is {problem.line}: {problem.message}"
        raise gzip_error(path, problem.line, exc, detail) from None
