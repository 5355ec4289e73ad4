"""Converged layers in one launch on the CUDA backend (no GPU): the argument table
is the struct the kernel reads (its runs and rows: test_cuda_fake_device.py)."""

from __future__ import annotations

import re

from spdnn_mpi.backends.cuda import held
from spdnn_mpi.backends.cuda import layout as lay

#: Bytes of the C types the argument tables' fields are declared with.
_C_SIZES = {"u16*": 8, "int*": 8, "int2*": 8, "float*": 8, "int": 4, "float": 4}


def struct_offsets(unit: str, struct: str) -> tuple[list[str], list[int], int]:
    """(field names, offsets, size) of ``struct`` in kernel source ``unit``, as the C
    layout gives them."""
    source = (lay.kernel_source_dir() / unit).read_text(encoding="utf-8")
    body = re.search(rf"struct {struct} \{{(.*?)\}};", source, re.S).group(1)
    fields = []
    for line in body.splitlines():
        m = re.match(r"\s*(?:const\s+)?(\w+)\s*(\*?)\s*([\w, ]+);", line)
        if m:
            fields += [(name.strip(), m.group(1) + m.group(2))
                       for name in m.group(3).split(",")]
    offset, offsets = 0, []
    for _name, ctype in fields:
        size = _C_SIZES[ctype]
        offset = -(-offset // size) * size
        offsets.append(offset)
        offset += size
    return [name for name, _ in fields], offsets, -(-offset // 8) * 8


def test_argument_table_matches_the_kernels_struct_field_for_field():
    """HELD_LAYER_DTYPE is read by the kernel as ``struct HeldLayer``: same fields, in
    the same order, at the offsets the C layout gives them."""
    assert_table_is_struct(held.HELD_LAYER_DTYPE, "spdnn_held.cuh", "HeldLayer")


def assert_table_is_struct(dtype, unit: str, struct: str) -> None:
    """``dtype`` has ``struct``'s fields (in kernel source ``unit``), in its order, at
    the offsets and size the C layout gives them."""
    names, offsets, size = struct_offsets(unit, struct)
    assert names == list(dtype.names)
    assert offsets == [dtype.fields[name][1] for name in dtype.names]
    assert dtype.itemsize == size


def test_the_run_kernels_launch_bounds_are_the_hosts_blocks_an_sm():
    """The grid ``HeldLayers`` launches layers_run_grid with (cooperative: every block
    resident) rests on the blocks an SM the kernel is compiled for."""
    source = (lay.kernel_source_dir() / "spdnn_runs.cu").read_text(encoding="utf-8")
    assert f"#define RUN_BLOCKS_PER_SM {held.RUN_BLOCKS_PER_SM}\n" in source
    assert "__launch_bounds__(SPDNN_HELD_THREADS, RUN_BLOCKS_PER_SM)" in source


def test_the_flows_ring_and_words_are_the_kernels():
    """The ring and scratch words ``HeldLayers`` allocates for layers_held_flow are the
    sizes the kernel indexes (FLOW_RING slots, FLOW_HEAD words before the alive bits),
    and the kernel runs one block an SM, as the cooperative launch's grid assumes."""
    source = (lay.kernel_source_dir() / "spdnn_flow.cu").read_text(encoding="utf-8")
    span = int(re.search(r"^#define FLOW_SPAN (\d+)$", source, re.M).group(1))
    assert "#define FLOW_RING (2 * FLOW_SPAN)\n" in source and held.FLOW_RING == 2 * span
    assert f"#define FLOW_HEAD {held.FLOW_HEAD}\n" in source
    assert "__launch_bounds__(SPDNN_HELD_THREADS, 1)" in source
    assert "spdnn_flow.cu" in lay.KERNEL_UNITS
