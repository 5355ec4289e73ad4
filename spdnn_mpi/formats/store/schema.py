"""Names and versions of the store schema (``docs/store.md``), shared by reader and writer.

Bump ``SCHEMA_VERSION`` on any incompatible change and add the versions the
reader still understands to ``SUPPORTED_SCHEMA_VERSIONS``.
"""

from __future__ import annotations

FORMAT_NAME = "spdnn_mpi.store"
SCHEMA_VERSION = 3
#: Schema versions this code reads. 1: no activations, readout, labels or predictions
#: (read as ReLU layers, readout ``alive``); 2: one HDF5 group a layer; 3: every
#: layer's arrays packed into a few datasets with a table of offsets.
SUPPORTED_SCHEMA_VERSIONS = frozenset({1, 2, 3})


def layer_key(k: int) -> str:
    """Group name of 0-based layer ``k`` (``l00001`` is the first layer)."""
    return f"l{k + 1:05d}"
