"""Errors the command line turns into one clear message and a non-zero exit."""

from __future__ import annotations

import os


class SpdnnError(Exception):
    """An error the user can act on; the CLI prints it without a traceback."""


class InputFormatError(SpdnnError):
    """Bad content in an input file, located by file and (1-based) line."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str):
        self.path = os.fspath(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # pickled as built: a worker process hands it to the main one
        return type(self), (self.path, self.line, self.message)


class StoreError(SpdnnError):
    """A store that is missing, not ours, of an unknown schema or inconsistent."""


class ModelFormatError(SpdnnError):
    """A model file (ONNX, safetensors) that cannot be represented, located by node or tensor."""

    def __init__(self, path: str | os.PathLike, where: str | None, message: str):
        self.path = os.fspath(path)
        self.where = where
        self.message = message
        super().__init__(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def __reduce__(self):
        return type(self), (self.path, self.where, self.message)


class RankFailure(SpdnnError):
    """A failure some rank had in a phase, raised on every rank; only the rank that
    failed first has ``print_here`` set, so the CLI prints it once."""

    def __init__(self, message: str, rank: int, print_here: bool):
        super().__init__(message)
        self.rank = rank
        self.print_here = print_here

    def __reduce__(self):
        return type(self), (str(self), self.rank, self.print_here)
