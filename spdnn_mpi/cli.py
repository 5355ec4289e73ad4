"""The ``spdnn`` command: one subcommand a module of ``spdnn_mpi.commands``
(``add_arguments(parser)``, ``run(args) -> int``); a ``SpdnnError`` is one line and
exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading

from spdnn_mpi import __version__
from spdnn_mpi.errors import SpdnnError

#: subcommand -> one-line help; its module is spdnn_mpi.commands.<subcommand>
#: (or the one in COMMAND_MODULES)
SUBCOMMANDS: dict[str, str] = {
    "generate": "generate a challenge-shaped network and inputs",
    "prepare": "convert official Graph Challenge TSV files into a store",
    "import": "import a trained MLP (ONNX or safetensors) into a store",
    "info": "describe a store",
    "infer": "run inference on a store (also under mpiexec/srun)",
    "bench": "benchmark backends and peers; prints a table, writes JSON",
    "demo": "generate (once) the built-in 1024x120 case, infer and check",
}

#: Subcommands whose module name differs (``import`` is a Python keyword).
COMMAND_MODULES: dict[str, str] = {"import": "import_model"}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the empty ones (None, False, []); keeps the examples
    (a command's ``EXAMPLES``, shown as its epilog) as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, []) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spdnn",
        description="Sparse DNN inference at scale (Sparse DNN Graph Challenge).",
    )
    parser.add_argument("--version", action="version", version=f"spdnn_mpi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in SUBCOMMANDS.items():
        module = importlib.import_module(f"spdnn_mpi.commands.{COMMAND_MODULES.get(name, name)}")
        p = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip().splitlines()[0],
            epilog=getattr(module, "EXAMPLES", None),
            formatter_class=_HelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same cleanup runs (temporaries removed)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the flush at exit cannot fail (and print) again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # no file descriptor (a captured stream): nothing to flush at exit


class _Stdout:
    """``sys.stdout`` that remembers its failed write, so ``main`` can tell a full or
    closed standard output from any other OSError."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self.error = exc
            raise

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    from spdnn_mpi.comm import abort_others, agree_on_command, launched_rank

    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    stdout = sys.stdout = _Stdout(sys.stdout)
    try:
        agree_on_command(args.command)
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe or a full device shows here, not at exit
        return status
    except OSError as exc:
        if exc is not stdout.error:
            raise
        _stdout_to_devnull()
        if isinstance(exc, BrokenPipeError):  # the reader is gone (`| head -1`): quietly,
            return 128 + signal.SIGPIPE  # with the status of a tool SIGPIPE stopped
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"spdnn {args.command}: error: cannot write standard output: {reason}",
              file=sys.stderr, flush=True)
        return 2
    except SpdnnError as exc:
        if getattr(exc, "print_here", True):  # a RankFailure prints on its rank only
            print(f"spdnn {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        stopped = "terminated" if isinstance(exc, Terminated) else "interrupted"
        status = 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130
        # under a launcher: which rank, and the others end with it
        print(f"spdnn {args.command}: {launched_rank()}{stopped}", file=sys.stderr)
        abort_others(status)
        return status
    finally:
        sys.stdout = stdout._stream
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def entry() -> int:
    """The ``spdnn`` process: :func:`main`, then an exit that skips the interpreter's final
    garbage collection over every object numba and CuPy made (0.12 s of each run).

    Every output is complete and closed when ``main`` returns, so nothing waits on that
    collection; ``main`` itself, called in a longer-lived process, frees as usual.
    """
    status = main()
    gc.freeze()
    return status


if __name__ == "__main__":
    raise SystemExit(entry())
