"""The CUDA kernels' compile-time settings (``backends.cuda.config``): CPU only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig, parse_defines
from spdnn_mpi.errors import SpdnnError

#: The values every remaining setting had in the kernels before the settings became
#: one record (DEFAULT_DEFINES and the kernel files' own fallbacks), and those of the
#: converged layers' one-launch kernel (SPDNN_HELD_*) since.
BEFORE = {
    "SPDNN_SMEM_THREADS": 512, "SPDNN_GLOBAL_THREADS": 256, "SPDNN_GROUP_THREADS": 256,
    "SPDNN_ELL_BATCH": 8, "SPDNN_FEW_BATCH": 32, "SPDNN_CSR_WARP_OUTPUTS": 8,
    "SPDNN_CSR_ITEMS_PER_BLOCK": 1, "SPDNN_CSR4_GROUP": 4, "SPDNN_CSR4_MIN_BLOCKS": 1,
    "SPDNN_GROUP_LANE_SLOTS": 8, "SPDNN_GROUP_MIN_BLOCKS": 3, "SPDNN_GROUP_BATCH": 8,
    "SPDNN_GSUM_BATCH": 32, "SPDNN_GSUM_MIN_BLOCKS": 2, "SPDNN_HELD_THREADS": 256,
    "SPDNN_HELD_BATCH": 32, "SPDNN_HELD_ROW_THREADS": 256, "SPDNN_COMPACT_DIV": 10,
    "SPDNN_COMPACT_WARP_NEURONS": 64, "SPDNN_MERGE_COLLIDE": 0,
}


def _kernel_texts() -> dict[str, str]:
    folder = lay.kernel_source_dir()
    return {name: folder.joinpath(name).read_text(encoding="utf-8")
            for name in lay.KERNEL_HEADERS + lay.KERNEL_UNITS}


def test_defaults_are_the_values_the_kernels_had():
    config = KernelConfig()
    assert config.defines() == BEFORE
    lines = config.define_block().splitlines()
    assert lines == [f"#define {name} {value}" for name, value in BEFORE.items()]


def test_every_setting_a_kernel_reads_is_a_field_and_every_field_is_read():
    names = set(KernelConfig.define_names())
    used: set[str] = set()
    for name, text in _kernel_texts().items():
        found = set(re.findall(r"\bSPDNN_[A-Z0-9_]+\b", text))
        assert found <= names, f"{name}: {sorted(found - names)} are not KernelConfig fields"
        used |= found
    assert used == names, f"never read by a kernel: {sorted(names - used)}"


def test_settings_are_defined_only_by_the_config():
    """No fallback #define of a setting in the kernel files: the config's block is
    the only place a value comes from (a missing block stops the compile)."""
    for name, text in _kernel_texts().items():
        assert not re.search(r"#\s*define\s+SPDNN_", text), name
    assert "#error" in _kernel_texts()["spdnn_common.cuh"]


def test_no_setting_comes_from_the_environment():
    folder = Path(lay.__file__).parent
    for path in folder.glob("*.py"):
        assert "environ" not in path.read_text(encoding="utf-8"), path.name


@pytest.mark.parametrize("call, bad", [
    (lambda: KernelConfig().with_overrides(csr4_groups=2), "'csr4_groups'"),
    (lambda: KernelConfig.from_defines({"SPDNN_CSR4_AHEAD": 2}), "'SPDNN_CSR4_AHEAD'"),
    (lambda: KernelConfig.from_defines({"csr4_group": 2}), "'csr4_group'"),
])
def test_unknown_names_are_refused_with_the_known_ones(call, bad):
    with pytest.raises(SpdnnError, match=f"unknown kernel .*{bad}") as exc:
        call()
    assert "csr4_group" in str(exc.value) or "SPDNN_CSR4_GROUP" in str(exc.value)
    assert "smem_threads" in str(exc.value) or "SPDNN_SMEM_THREADS" in str(exc.value)


def test_overrides_and_defines_give_the_same_record():
    a = KernelConfig().with_overrides(csr4_group=1, merge_collide=1)
    b = KernelConfig.from_defines({"SPDNN_CSR4_GROUP": 1, "SPDNN_MERGE_COLLIDE": 1})
    assert a == b == KernelConfig(csr4_group=1, merge_collide=1)
    assert "#define SPDNN_CSR4_GROUP 1\n" in a.define_block()
    assert KernelConfig.from_defines({}) == KernelConfig()
    with pytest.raises(TypeError):
        KernelConfig(csr4_groups=2)
    with pytest.raises(AttributeError):
        a.csr4_group = 2  # frozen: a config in use cannot change under a module


@pytest.mark.parametrize("fields, message", [
    ({"smem_threads": 0}, "SPDNN_SMEM_THREADS=0: must be an integer >= 1"),
    ({"csr4_group": 2.0}, "SPDNN_CSR4_GROUP=2.0"),
    ({"ell_batch": True}, "SPDNN_ELL_BATCH=True"),
    ({"merge_collide": 2}, "SPDNN_MERGE_COLLIDE=2: must be 0 or 1"),
])
def test_values_that_are_not_counts_are_refused(fields, message):
    with pytest.raises(SpdnnError, match=re.escape(message)):
        KernelConfig(**fields)


def test_defines_are_parsed_as_name_int_and_anything_else_is_named():
    assert parse_defines(["SPDNN_CSR4_GROUP=1", "SPDNN_X=-3"]) == {
        "SPDNN_CSR4_GROUP": 1, "SPDNN_X": -3}
    assert parse_defines([]) == {}
    for bad in ("SPDNN_X", "SPDNN_X=1.5", "=4", "SPDNN_X="):
        with pytest.raises(ValueError, match=f"{bad!r}: expected NAME=INT"):
            parse_defines([bad])
