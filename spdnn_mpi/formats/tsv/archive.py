"""Layer files read straight from the official archive (``neuron{N}.tar.gz``), never unpacked.

The challenge ships each network as a tar.gz of a ``neuron{N}/`` folder of
``n{N}-l{k}.tsv`` files (about 100 GB of text for N = 65536 x 1920 layers).
:class:`ArchiveLayers` streams it member by member in archive order, which
is the order the archive was made in (not the layer order): each member's
bytes are handed on as a :class:`~spdnn_mpi.formats.tsv.text.MemberText`, to
be parsed (in worker processes) and put back in layer order by
``formats.tsv.layers``. The compressed stream is read through Python's own
decompressors, which check the end-of-stream marker and the checksum, so a
truncated or corrupt archive is an error, never a shorter network.
"""

from __future__ import annotations

import bz2
import contextlib
import io
import lzma
import os
import queue
import re
import tarfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from spdnn_mpi.errors import InputFormatError
from spdnn_mpi.formats.tsv.text import MemberText
from spdnn_mpi.formats.tsv.tree import LAYER_RE

#: ``neuron{N}.tar.gz`` (also .tgz, .tar, .tar.bz2, .tar.xz): N from the name.
ARCHIVE_RE = re.compile(r"^neuron(\d+)\.(?:tar\.gz|tgz|tar|tar\.bz2|tbz2|tar\.xz|txz)$")
_DAMAGE = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError)


#: Bytes read from the archive, and handed to tarfile, at a time.
CHUNK = 1 << 20
#: Members read ahead of the workers (N = 65536: about 60 MB each).
AHEAD = 8


class _Gunzip(io.RawIOBase):
    """The decompressed bytes of a gzip file, in large pieces.

    ``gzip.GzipFile`` under tarfile's stream mode decompresses 10 KB at a time
    and checks the CRC in Python (1.3 GB of layers: 3.6 s); here zlib reads
    whole gzip members (``wbits=31``) and checks their CRC and length itself
    (2.3 s). Members may follow one another (``cat a.gz b.gz``); zero padding
    after the last is ignored, as gzip does; a cut stream is an EOFError.
    """

    def __init__(self, raw) -> None:
        self._raw = raw
        self._zlib = zlib.decompressobj(31)
        self._out = memoryview(b"")
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out and not self._done:
            self._decompress(max(len(buffer), CHUNK))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress(self, size: int) -> None:
        z = self._zlib
        if z.eof:  # a member ended: another one, zero padding, or the end
            rest = z.unused_data or self._raw.read(CHUNK)
            while rest and not rest.strip(b"\0"):
                rest = self._raw.read(CHUNK)
            if not rest:
                self._done = True
                return
            if rest[:2] != b"\x1f\x8b":
                raise OSError("data after the end of the gzip stream is not gzip")
            self._zlib = z = zlib.decompressobj(31)
            self._out = memoryview(z.decompress(rest, size))
            return
        data = z.unconsumed_tail or self._raw.read(CHUNK)
        if not data:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        self._out = memoryview(z.decompress(data, size))


def _decompressed(raw):
    """A file object over the decompressed bytes of ``raw`` (gzip, bzip2, xz or plain tar)."""
    head = raw.read(6)
    raw.seek(0)
    if head[:2] == b"\x1f\x8b":
        return io.BufferedReader(_Gunzip(raw), CHUNK)
    if head[:3] == b"BZh":
        return bz2.BZ2File(raw)
    if head == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)
    return raw


class ArchiveLayers:
    """The layer files ``n{N}-l{k}.tsv[.gz]`` of a tar archive, streamed in archive order.

    ``neurons`` None takes N from the archive's name (``neuron{N}.tar.gz``) or
    its first layer file; ``n_layers`` None takes every layer found (then
    known once the stream has ended: :meth:`count`). A member that is not a
    layer file of this N, a layer given twice, a damaged stream or a layer
    missing are InputFormatErrors naming the archive and the member.
    """

    #: members are read into this process (``formats.tsv.layers`` parses them in threads)
    in_memory = True

    def __init__(self, path: str | os.PathLike, neurons: int | None = None,
                 n_layers: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise InputFormatError(self.path, None, "no such archive or weights folder")
        self.size = self.path.stat().st_size
        self.n_layers = n_layers
        self.found: dict[int, str] = {}  # layer -> member name
        self._raw = None
        self._read = 0  # compressed bytes read, for progress
        self._reader = None  # (thread, stop event, queue) while reading ahead
        named = ARCHIVE_RE.match(self.path.name)
        self.neurons = neurons or (int(named.group(1)) if named else None)
        if self.neurons is None:
            self.neurons = self._first_neurons()

    def useful_jobs(self, jobs: int) -> int:
        """Parse threads: members are already in memory, so as many as asked."""
        return jobs if self.n_layers is None else max(1, min(jobs, self.n_layers))

    def sources(self, out: Path) -> dict[str, Path]:
        """The inputs the output must not be: the archive."""
        return {"the weights archive": self.path}

    def fraction(self) -> float:
        """The share of the archive read so far (0..1)."""
        return min(self._read / self.size, 1.0) if self.size else 1.0

    def _first_neurons(self) -> int:
        """N of the first layer file in the archive (its name), read from the stream's start."""
        for member in self._members():
            m = LAYER_RE.match(PurePosixPath(member.name).name)
            if m:
                return int(m.group(1))
            self._layer_number(member)  # raises: not a layer file
        raise InputFormatError(self.path, None, "no layer files n{N}-l{k}.tsv in the archive")

    def _members(self, tar_out: list | None = None) -> Iterator[tarfile.TarInfo]:
        """The archive's file members in archive order (folders skipped); damage raises."""
        last = None
        with open(self.path, "rb") as raw:
            self._raw = raw
            try:
                stream = _decompressed(raw)
                tar = tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK)
                if tar_out is not None:
                    tar_out.append(tar)
                while (member := tar.next()) is not None:
                    last = member.name
                    if not member.isdir():
                        yield member
                # the checksum of gzip, bzip2 and xz is checked at the end of the stream
                while stream.read(CHUNK):
                    pass
                self._read = self.size
            except _DAMAGE as exc:
                raise self._damaged(exc, last) from None
            finally:
                self._raw = None

    def _damaged(self, exc: BaseException, last: str | None) -> InputFormatError:
        what = "truncated" if isinstance(exc, EOFError) or "end of data" in str(exc) \
            else "corrupt or not a tar archive"
        where = f" after member {last}" if last else ""
        return InputFormatError(self.path, None, f"{what} ({exc}){where}; re-download it, or "
                                                 "pass the unpacked neuron{N} folder")

    def _layer_number(self, member: tarfile.TarInfo) -> int:
        """k of a member ``.../n{N}-l{k}.tsv[.gz]`` of this N; anything else is refused."""
        m = LAYER_RE.match(PurePosixPath(member.name).name)
        where = f"{self.path}[{member.name}]"
        if not m or not member.isfile():
            kind = "not a regular file" if m else "not a layer file n{N}-l{k}.tsv[.gz]"
            raise InputFormatError(where, None, f"{kind}: the archive should hold only the "
                                                "layer files of one network")
        if self.neurons is not None and int(m.group(1)) != self.neurons:
            raise InputFormatError(where, None, f"a layer of N={m.group(1)}, but the network "
                                                f"has N={self.neurons}")
        k = int(m.group(2))
        if k in self.found:
            raise InputFormatError(where, None, f"layer {k} given twice (also as "
                                                f"{self.found[k]})")
        if k == 0:
            raise InputFormatError(where, None, "layer 0: layers count from 1")
        return k

    def _read_members(self) -> Iterator[tuple[int, MemberText]]:
        """(k, bytes of layer k) for each wanted layer, in archive order; stops as soon
        as layers 1..n_layers are all read (``n_layers`` given)."""
        self.found = {}
        wanted = 0
        holder: list = []
        for member in self._members(holder):
            k = self._layer_number(member)
            self.found[k] = member.name
            if self.n_layers is not None and k > self.n_layers:
                continue  # not wanted: skipped over, not parsed
            try:
                data = holder[0].extractfile(member).read()
            except _DAMAGE as exc:
                raise self._damaged(exc, member.name) from None
            if len(data) != member.size:
                raise self._damaged(EOFError("unexpected end of data"), member.name)
            self._read = self._raw.tell()
            yield k, MemberText(f"{self.path}[{member.name}]", data)
            wanted += 1
            if wanted == self.n_layers:
                return

    def __iter__(self) -> Iterator[tuple[int, MemberText]]:
        """:meth:`_read_members` run ahead in a thread (up to ``AHEAD`` members): the
        archive is decompressed (zlib lets go of the GIL) while this thread sends
        members to the workers and writes the store. Stop it early with :meth:`close`."""
        self.close()
        ahead: queue.Queue = queue.Queue(AHEAD)
        stop = threading.Event()

        def run() -> None:
            try:
                for item in self._read_members():
                    while not stop.is_set():
                        try:
                            ahead.put((True, item), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                ahead.put((True, None))
            except BaseException as exc:  # handed to the reading thread, which raises it
                ahead.put((False, exc))

        thread = threading.Thread(target=run, name="spdnn-archive", daemon=True)
        self._reader = (thread, stop, ahead)
        thread.start()
        try:
            while True:
                ok, item = ahead.get()
                if not ok:
                    raise item
                if item is None:
                    return
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread reading ahead (if any) and wait for it."""
        if self._reader is None:
            return
        thread, stop, ahead = self._reader
        stop.set()
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                ahead.get(timeout=0.05)  # let a blocked put see the stop
        thread.join()
        self._reader = None

    def count(self) -> int:
        """The number of layers, once the stream is read; a layer missing is an error
        naming it (and the layers after it, as ``--layers`` would skip them)."""
        want = self.n_layers if self.n_layers is not None else max(self.found, default=0)
        missing = [k for k in range(1, want + 1) if k not in self.found]
        if not self.found:
            raise InputFormatError(self.path, None,
                                   f"no layer files n{self.neurons}-l{{k}}.tsv in the archive")
        if missing:
            k = missing[0]
            name = f"n{self.neurons}-l{k}.tsv"
            later = sorted(j for j in self.found if j > k)
            hint = (f", but layers {later[0]}..{later[-1]} are there" if later else
                    f" (it holds layers 1..{k - 1})")
            if later and k > 1:
                hint += f"; pass --layers {k - 1} to use only the first {k - 1}"
            raise InputFormatError(self.path, None,
                                   f"missing layer file (no member {name} or {name}.gz){hint}")
        return want

    def describe(self) -> str:
        """``first .. last`` member names of the layers read, for the store's provenance."""
        names = [self.found[k] for k in sorted(self.found) if k <= self.count()]
        return f"{names[0]} .. {names[-1]}"
