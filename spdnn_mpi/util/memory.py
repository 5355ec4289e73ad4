"""Host memory: what is available, what a process used at its peak, and early refusal
(``require``: a run that cannot fit stops at once, not swapping an hour in)."""

from __future__ import annotations

import mmap
import resource
import sys

import numpy as np

from spdnn_mpi.errors import SpdnnError

GB = 1e9


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (capped by a cgroup limit), or 4 GiB if unreadable."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = 4 << 30
    limit = _cgroup_room()
    return min(avail, limit) if limit is not None else avail


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup v2 memory limit (a Slurm job's), if any."""
    try:
        with open("/proc/self/cgroup") as fh:
            paths = [line.split(":", 2)[2].strip() for line in fh if line.startswith("0::")]
        if not paths:
            return None
        folder = "/sys/fs/cgroup" + paths[0].rstrip("/")
        with open(f"{folder}/memory.max") as fh:
            text = fh.read().strip()
        if text == "max":
            return None
        with open(f"{folder}/memory.current") as fh:
            used = int(fh.read().strip())
        return max(0, int(text) - used)
    except (OSError, ValueError, IndexError):
        return None


def small_page_array(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """A fresh array in base pages (no transparent huge pages), zero until written.

    NumPy asks for huge pages on large arrays, and where the kernel then
    compacts memory to find them (``defrag`` = ``madvise``, a common default)
    the first touch of a buffer stalled: the CPU backend's two 245 MB feature
    buffers took 0.54-0.77 s to lay out the inputs against 0.13-0.14 s in base
    pages, with the same inference time (real 1024 network cycled to 1920
    layers, 2-core VM, 2026-12-05).
    """
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    try:
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError):  # not Linux, or a kernel without huge pages
        pass  # nothing to opt out of
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def peak_host_bytes() -> dict[str, int]:
    """Peak resident memory of this process and of its finished children (getrusage)."""
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
    return {"peak_host_bytes": int(own), "peak_children_bytes": int(children)}


def format_bytes(n: float) -> str:
    """``1.23 GB`` / ``456 MB`` (``61.4 TB``, ``6.1e+08 PB`` beyond): decimal units, as the
    docs quote them."""
    if n >= 1e15:
        return f"{n / 1e15:.3g} PB"
    if n >= 1e12:
        return f"{n / 1e12:.3g} TB"
    if n >= GB:
        return f"{n / GB:.2f} GB"
    return f"{n / 1e6:.0f} MB"


def require(need: int, what: str, hint: str = "", available: int | None = None) -> None:
    """Raise a clear SpdnnError when ``need`` bytes exceed the memory available now."""
    have = available_bytes() if available is None else available
    if need > have:
        raise SpdnnError(
            f"{what} needs about {format_bytes(need)} of host memory, "
            f"{format_bytes(have)} is available" + (f"; {hint}" if hint else "")
        )
