"""The compile-time parameters of the CUDA kernels, in one typed record.

Every ``SPDNN_*`` name the kernels in ``cuda/`` read is a field of
``KernelConfig`` and is defined nowhere else: the kernel files have no
fallback values, and ``define_block()`` is the ``#define`` block put first in
the NVRTC program (``layout.assemble_source``) and in
``tools/compile_kernels.sh``. Field ``smem_threads`` is ``SPDNN_SMEM_THREADS``,
and so on. Names that are not fields are refused: a typo would otherwise
become a new ``#define`` that no kernel reads.

Each default says what it was measured against (card, date, figures).
Settings that only the host reads are not here: they are constants or constructor arguments of the
modules that use them (e.g. ``launch.GROUP_CHUNK``).
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

    # -- block sizes -------------------------------------------------------------
    #: threads a block of the staged kernels (whole 32-row tiles in shared memory:
    #: layer_ell_smem, layer_csr4<true>); 256 and 1024 gave 36.9 and 37.0 against
    #: 38.8 TE/s at 1024 x 120 (H200, 2026-12-02)
    smem_threads: int = 512
    #: threads a block of the L1/L2 kernels (layer_ell_global, layer_csr4<false>,
    #: layer_csr); at 1024 / 4096 / 16384 x 120, 128 gave 38.9 / 35.9 / 36.9 and 512
    #: 38.3 / 28.0 / 28.1 against 38.8 / 37.7 / 39.2 TE/s (H200, 2026-12-02)
    global_threads: int = 256
    #: threads a block of the grouped kernels (layer_group, layer_group_sum); not
    #: measured against other sizes
    group_threads: int = 256

    # -- ELL kernels (uniform weights, fixed degree) -------------------------------
    #: gathers a lane issues before their adds; 8 (36 registers in the L1/L2 kernel)
    #: beat 16 by 1.36x at 4096 x 120 and 1.41x at 16384 x 120, 32 equalled 16
    #: (H200, 2026-12-02)
    ell_batch: int = 8
    #: the same once at most one tile is held (compressed, converged rows), so a
    #: layer waits one latency, not four; 8 gave the same (892.0 against 896.4 TE/s
    #: at 16384 x 1920, H200, 2026-12-03)
    few_batch: int = 32

    # -- general CSR kernel (layer_csr) -------------------------------------------
    #: outputs a warp takes in one work item of the L1/L2 form; 4 gave 32.5 against
    #: 31.5 TE/s at 4096 x 480, within the spread between machines, and 16 was
    #: slower (H200, 2026-12-02)
    csr_warp_outputs: int = 8
    #: the staged form splits a tile's outputs until each block has this many items;
    #: 1 against 4: 25.5 against 22.6 TE/s at 1024 x 120, 38.7 against 32.0 at
    #: 1024 x 1920 (H200, 2026-12-02)
    csr_items_per_block: int = 1

    # -- CSR4 kernel (layer_csr4: any degree, 16-bit indices) ---------------------
    #: chunks of 8 entries whose gathers the L1/L2 form issues together; 4 against
    #: one chunk at a time: the 10-output head of the 90 % pruned MNIST model at 1000
    #: digits 9.2 against 12.8 us (H100, 2026-12-05). Layers with values too wide to
    #: stage (n_in > 1792) take the same form: not measured there (230-255 registers,
    #: still one 256-thread block an SM)
    csr4_group: int = 4
    #: blocks an SM the L1/L2 form is compiled for (1: no register cap); 3 or 4
    #: made the 90 % model's head 18.9-20.5 against 12.8 us at 1000 digits (H200,
    #: 2026-12-04, with one chunk gathered at a time)
    csr4_min_blocks: int = 1

    # -- grouped kernels (outputs sharing their inputs) ---------------------------
    #: slots of a group a lane computes (4, 8 or 16); 8 at 3 blocks an SM against
    #: 16 at 2: 60.7 against 57.3 TE/s at 1024 x 120, equal at 4096 and 65536
    #: (H200, 2026-12-03)
    group_lane_slots: int = 8
    #: blocks an SM layer_group is compiled for (3: 80 registers), with the above
    group_min_blocks: int = 3
    #: input loads a lane of layer_group issues before their multiply-adds; not
    #: measured against other values
    group_batch: int = 8
    #: input loads a lane of layer_group_sum (uniform layers) keeps in flight, and
    #: the blocks an SM it is compiled for (32 at 2: 128 registers); at 1024 / 4096 /
    #: 16384 / 65536 x 120: 90.7 / 101.7 / 110.1 / 100.6 TE/s against 76.9 / 90.3 /
    #: 99.7 / 91.3 with 8 at 4 and 76.9 / 94.3 / 104.1 / 95.9 with 16 at 3 (H200,
    #: 2026-12-04)
    gsum_batch: int = 32
    gsum_min_blocks: int = 2

    # -- compaction (moving the survivors to dense tiles) -------------------------
    #: a layer's plan compacts when that frees at least 1/compact_div of the tiles;
    #: 20 gave 76.0 against 82.0 TE/s at 1024 x 120 (H100, 2026-12-05), 4 and 25
    #: 36.9 and 37.6 against 38.8 (H200, 2026-12-02)
    compact_div: int = 10
    #: neurons one warp of compact_rows copies per work item; not measured against
    #: other values
    compact_warp_neurons: int = 64

    # -- tests only ---------------------------------------------------------------
    #: 1: every row hashes alike in the merge (row_hashes), so only the exact
    #: comparison decides which rows are equal; never set outside tests
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
        """``base`` (default: the defaults) with these #defines (``SPDNN_CSR4_GROUP``
        and so on, as the tools' ``--define`` give them) changed."""
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
    """``["NAME=INT", ...]`` (the profiler's --define)
    as a dict; ValueError naming the item that is not NAME=INT (whether the names
    exist is ``KernelConfig.from_defines``' business)."""
    defines = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise ValueError(f"{item!r}: expected NAME=INT")
        defines[name] = int(value)
    return defines
