"""The compile-time parameters of the CUDA kernels, in one typed record.

Field ``x`` is ``#define SPDNN_X``, defined nowhere else: the kernel files have no
fallback values, and unknown names are refused (a typo would be a ``#define`` no
kernel reads). The measurements behind the defaults: docs/design.md. Settings only
the host reads are constants of the modules that use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spdnn_mpi.errors import SpdnnError

#: What every field's #define name starts with.
PREFIX = "SPDNN_"


@dataclass(frozen=True)
class KernelConfig:
    """The kernels' compile-time parameters (defaults: the measured best)."""

    #: threads a block of the staged kernels; 256/1024: 36.9/37.0 against 38.8 TE/s (H200)
    smem_threads: int = 512
    #: threads a block of the L1/L2 kernels; 128 and 512 were slower up to 28 % (H200)
    global_threads: int = 256
    #: threads a block of the grouped kernels; not measured against other sizes
    group_threads: int = 256

    #: gathers an ELL lane issues before its adds; 8 beat 16 by 1.36-1.41x (H200)
    ell_batch: int = 8
    #: the same once at most one tile is held; 8: 892.0 against 896.4 TE/s (H200)
    few_batch: int = 32

    #: outputs a warp takes in one item of layer_csr (L1/L2); 4: within the spread (H200)
    csr_warp_outputs: int = 8
    #: staged layer_csr splits a tile until a block has this many items; 4: 11-17 % slower
    csr_items_per_block: int = 1

    #: chunks of 8 entries whose gathers layer_csr4 (L1/L2) issues together; 1: 12.8
    #: against 9.2 us on the 10-output MNIST head (H100)
    csr4_group: int = 4
    #: blocks an SM layer_csr4 (L1/L2) is compiled for (1: no register cap); 3-4: 48-60 % slower
    csr4_min_blocks: int = 1

    #: slots of a group a lane computes (4, 8 or 16); 16 at 2 blocks: 57.3 against 60.7 TE/s
    group_lane_slots: int = 8
    #: blocks an SM layer_group is compiled for (3: 80 registers), with the above
    group_min_blocks: int = 3
    #: input loads a lane of layer_group issues before its multiply-adds; not measured
    group_batch: int = 8
    #: input loads in flight a lane of layer_group_sum, and its blocks an SM (32 at 2:
    #: 128 registers); 8 at 4, 16 at 3: 5-15 % slower (H200)
    gsum_batch: int = 32
    gsum_min_blocks: int = 2

    #: converged layers in one launch over the card (layers_held_grid): threads a
    #: block at most, input loads in flight a lane (both measured on the one-cluster
    #: form it replaced: docs/design.md); also a block of layers_run_grid (not measured)
    held_threads: int = 256
    held_batch: int = 32
    #: threads a block of layers_held_row (one block a row held) at most: room for
    #: two layers' group ids a thread
    held_row_threads: int = 256

    #: a plan compacts when that frees at least 1/compact_div of the tiles; 20: 76.0
    #: against 82.0 TE/s (H100)
    compact_div: int = 10
    #: neurons one warp of compact_rows copies per work item; not measured
    compact_warp_neurons: int = 64

    #: tests only: 1 makes every row hash alike in the merge (only the exact check decides)
    merge_collide: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "merge_collide" else 1
            high = 1 if f.name == "merge_collide" else None
            if (type(value) is not int or value < low
                    or (high is not None and value > high)):
                bound = f"{low} or {high}" if high is not None else f"an integer >= {low}"
                raise SpdnnError(f"kernel setting {define_name(f.name)}={value!r}: "
                                 f"must be {bound}")

    @classmethod
    def define_names(cls) -> tuple[str, ...]:
        """The #define name of every field, in field order."""
        return tuple(define_name(f.name) for f in dataclasses.fields(cls))

    def defines(self) -> dict[str, int]:
        """#define name -> value, every field."""
        return {define_name(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

    def define_block(self) -> str:
        """The ``#define`` lines the kernel sources are compiled after."""
        return "".join(f"#define {name} {value}\n" for name, value in self.defines().items())

    def with_overrides(self, **fields: int) -> KernelConfig:
        """A copy with these fields (by field name, e.g. ``csr4_group=1``) changed."""
        known = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise SpdnnError(f"unknown kernel setting {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(known)})")
        return dataclasses.replace(self, **fields)

    @classmethod
    def from_defines(cls, defines: Mapping[str, int],
                     base: KernelConfig | None = None) -> KernelConfig:
        """``base`` (default: the defaults) with these #defines (``SPDNN_CSR4_GROUP``...)
        changed."""
        names = cls.define_names()
        unknown = sorted(set(defines) - set(names))
        if unknown:
            raise SpdnnError(f"unknown kernel #define {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(names)})")
        fields = {name[len(PREFIX):].lower(): value for name, value in defines.items()}
        return (base or cls()).with_overrides(**fields)


def define_name(field: str) -> str:
    """The #define of a field: ``smem_threads`` -> ``SPDNN_SMEM_THREADS``."""
    return PREFIX + field.upper()


def parse_defines(items: Sequence[str]) -> dict[str, int]:
    """``["NAME=INT", ...]`` (the profiler's --define) as a dict; ValueError naming an
    item that is not NAME=INT (the names are checked by ``KernelConfig.from_defines``)."""
    defines = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise ValueError(f"{item!r}: expected NAME=INT")
        defines[name] = int(value)
    return defines
