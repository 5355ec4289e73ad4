"""In-memory form of a sparse MLP and its inputs, shared by every module.

A layer is CSR of W transposed (row ``j``: the inputs of output ``j``), the layout
every backend computes from and the store keeps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

#: Challenge constants (see ../shared/reference/challenge.md).
CHALLENGE_CLIP = 32.0
CHALLENGE_WEIGHT = 1.0 / 16.0
CHALLENGE_BIAS = {1024: -0.30, 4096: -0.35, 16384: -0.40, 65536: -0.45}
CHALLENGE_NEURONS = (1024, 4096, 16384, 65536)
CHALLENGE_LAYERS = (120, 480, 1920)

#: Per-layer activations: ``relu`` (the challenge's, hidden layers) or ``none``
#: (a linear output layer, e.g. the logits of a classifier).
ACTIVATIONS = ("relu", "none")
#: What a run reports: ``alive`` (the challenge's categories: ids of the images
#: whose final row has a nonzero) or ``argmax`` (one predicted class per image).
READOUTS = ("alive", "argmax")


def challenge_bias(neurons: int) -> float:
    """Bias of the challenge network with ``neurons`` neurons: the published table,
    extended by -0.05 per factor of 4 for the other N = 16 * 4**m."""
    if neurons in CHALLENGE_BIAS:
        return CHALLENGE_BIAS[neurons]
    return round(-0.30 - 0.05 * math.log(neurons / 1024, 4), 6)


def index_dtype(extent: int) -> np.dtype:
    """Smallest index type for ids in ``[0, extent)``: 16 bits up to 65536, else 32."""
    return np.dtype(np.uint16) if extent <= 65536 else np.dtype(np.int32)


@dataclass
class Layer:
    """One layer ``y = min(act(x @ W + bias), clip)`` with W stored as CSR of W^T.

    ``values`` is None when every weight equals ``uniform_value``. ``bias``: a float
    or a float32 vector of length ``n_out``; ``clip`` None: no upper clip.
    """

    n_in: int
    n_out: int
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray | None = None
    uniform_value: float | None = None
    bias: float | np.ndarray = 0.0
    clip: float | None = None
    activation: str = "relu"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation {self.activation!r}; choose from {', '.join(ACTIVATIONS)}"
            )
        if (self.values is None) == (self.uniform_value is None):
            raise ValueError("a layer needs exactly one of values or uniform_value")
        if len(self.indptr) != self.n_out + 1:
            raise ValueError(f"indptr has {len(self.indptr)} entries, expected {self.n_out + 1}")
        if not isinstance(self.bias, float | int):
            self.bias = np.asarray(self.bias, dtype=np.float32)
            if self.bias.shape != (self.n_out,):
                raise ValueError(
                    f"bias vector has shape {self.bias.shape}, expected ({self.n_out},)"
                )
        else:
            self.bias = float(self.bias)

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    @property
    def bias_is_scalar(self) -> bool:
        return isinstance(self.bias, float)

    @functools.cached_property
    def row_degree(self) -> int | None:
        """Nonzeros per output neuron when every output has the same count, else None
        (kept: asked per layer by every layout, 6 us each)."""
        counts = np.diff(self.indptr)
        if len(counts) and np.all(counts == counts[0]):
            return int(counts[0])
        return None

    @property
    def floor(self) -> float:
        """Lower bound of the fused epilogue: 0 for ReLU, -inf for no activation."""
        return 0.0 if self.activation == "relu" else -math.inf

    @property
    def maps_zero_to_zero(self) -> bool:
        """True when an all-zero input row gives an all-zero output (only then may a
        dead row be dropped: it can never come back)."""
        bias = np.asarray(self.bias)
        ok = np.all(bias <= 0) if self.activation == "relu" else np.all(bias == 0)
        return bool(ok) and (self.clip is None or self.clip >= 0)

    def activate(self, z: np.ndarray) -> np.ndarray:
        """The epilogue after the bias, in place on float32 ``z``: activation, then clip."""
        if self.activation == "relu":
            np.maximum(z, 0, out=z)
        if self.clip is not None:
            np.minimum(z, np.float32(self.clip), out=z)
        return z

    def weight_values(self) -> np.ndarray:
        """Per-nonzero float32 values (materialised when uniform)."""
        if self.values is not None:
            return self.values
        return np.full(self.nnz, self.uniform_value, dtype=np.float32)

    def bias_vector(self) -> np.ndarray:
        """Bias as a float32 vector of length ``n_out``."""
        if self.bias_is_scalar:
            return np.full(self.n_out, self.bias, dtype=np.float32)
        return self.bias

    def to_scipy_t(self):
        """W^T as a ``scipy.sparse.csr_matrix`` (n_out x n_in), float32."""
        import scipy.sparse as sp

        return sp.csr_matrix(
            (self.weight_values(), self.indices.astype(np.int32), self.indptr),
            shape=(self.n_out, self.n_in),
        )

    @classmethod
    def from_coo(
        cls,
        rows_in: np.ndarray,
        cols_out: np.ndarray,
        values: np.ndarray,
        n_in: int,
        n_out: int,
        *,
        bias: float | np.ndarray = 0.0,
        clip: float | None = None,
        activation: str = "relu",
    ) -> Layer:
        """Build from 0-based (input i, output j, value) triples of W(i, j), free of
        duplicates; values that are all equal collapse to ``uniform_value``."""
        rows_in = np.asarray(rows_in)
        cols_out = np.asarray(cols_out)
        values = np.asarray(values, dtype=np.float32)
        order = np.lexsort((rows_in, cols_out))
        indices = rows_in[order].astype(index_dtype(n_in), copy=False)
        counts = np.bincount(cols_out, minlength=n_out)
        indptr = np.zeros(n_out + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        vals = values[order]
        if len(vals) and np.all(vals == vals[0]):
            return cls(n_in, n_out, indptr, indices, None, float(vals[0]), bias, clip,
                       activation)
        return cls(n_in, n_out, indptr, indices, vals, None, bias, clip, activation)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _buffer(array: np.ndarray) -> np.ndarray:
    """The NumPy array whose memory ``array`` views (itself if it owns it; a parse
    worker's layer views a bytes object, which has no dtype to compare)."""
    return array.base if isinstance(array.base, np.ndarray) else array


def joined_prefix(arrays: Iterable[np.ndarray]) -> tuple[int, np.ndarray | None]:
    """How many of ``arrays``, from the first on, lie back to back in one buffer (1-D
    and contiguous, as a packed store's layers do), and those as one view of it,
    without a copy; (0, None) where the first is not such an array."""
    it = iter(arrays)
    first = next(it)
    base = _buffer(first)
    if (base.ndim != 1 or base.dtype != first.dtype or not base.flags.c_contiguous
            or first.ndim != 1 or not first.flags.c_contiguous):
        return 0, None
    start = _address(first)
    end, count = start + first.nbytes, 1
    for a in it:
        if (a.base is not base or a.dtype != first.dtype or a.ndim != 1
                or not a.flags.c_contiguous or _address(a) != end):
            break
        end += a.nbytes
        count += 1
    at = (start - _address(base)) // first.itemsize
    stop = at + (end - start) // first.itemsize
    return (count, base[at:stop]) if stop <= base.size else (0, None)


def stacked_indices(layers: Sequence[Layer]) -> np.ndarray:
    """The indices of fixed-degree layers of one shape as one (layers, n_out, degree)
    array: without a copy where they lie back to back in one buffer (a packed store's),
    else copied. Both backends lay such runs of layers out in one pass."""
    first, n = np.asarray(layers[0].indices), len(layers)
    shape = (n, layers[0].n_out, layers[0].row_degree)
    count, joined = joined_prefix(np.asarray(lay.indices) for lay in layers)
    if count == n and joined.size == n * first.size:
        return joined.reshape(shape)
    return np.stack([np.asarray(lay.indices, dtype=first.dtype) for lay in layers]).reshape(shape)


@dataclass
class Network:
    """An ordered list of layers, its readout (see ``READOUTS``) and where it came from."""

    layers: list[Layer]
    provenance: dict = field(default_factory=dict)
    readout: str = "alive"

    def __post_init__(self) -> None:
        if self.readout not in READOUTS:
            raise ValueError(f"readout {self.readout!r}; choose from {', '.join(READOUTS)}")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_inputs(self) -> int:
        return self.layers[0].n_in

    def widths(self) -> list[int]:
        """Neurons of each level: the inputs, then every layer's outputs."""
        return [self.n_inputs] + [layer.n_out for layer in self.layers]

    def edges(self, n_layers: int | None = None) -> int:
        """Sum of nnz(W_l) over the first ``n_layers`` layers."""
        return sum(layer.nnz for layer in self.layers[: n_layers or len(self.layers)])

    def truncated(self, n_layers: int) -> Network:
        if not 1 <= n_layers <= len(self.layers):
            raise ValueError(f"asked for {n_layers} layers; the network has {len(self.layers)}")
        return Network(self.layers[:n_layers], self.provenance, self.readout)


@dataclass
class SparseRows:
    """A CSR block of input feature rows (images x neurons), 0-based ids.

    ``values`` is None for binary inputs; ``first_row`` is the global index of row 0.
    """

    n_cols: int
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray | None = None
    first_row: int = 0

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1] - self.indptr[0])

    def row_values(self) -> np.ndarray:
        if self.values is not None:
            return self.values
        return np.ones(self.nnz, dtype=np.float32)

    def to_dense(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` as a dense float32 array."""
        stop = self.n_rows if stop is None else stop
        out = np.zeros((stop - start, self.n_cols), dtype=np.float32)
        lo, hi = self.indptr[start], self.indptr[stop]
        counts = np.diff(self.indptr[start : stop + 1])
        rows = np.repeat(np.arange(stop - start), counts)
        vals = self.row_values()[lo - self.indptr[0] : hi - self.indptr[0]]
        out[rows, self.indices[lo - self.indptr[0] : hi - self.indptr[0]].astype(np.int64)] = vals
        return out

    def slice(self, start: int, stop: int) -> SparseRows:
        """Rows ``[start, stop)`` as a new block (ids stay global through first_row)."""
        base = self.indptr[0]
        lo, hi = self.indptr[start] - base, self.indptr[stop] - base
        return SparseRows(
            self.n_cols,
            self.indptr[start : stop + 1] - self.indptr[start],
            self.indices[lo:hi],
            None if self.values is None else self.values[lo:hi],
            self.first_row + start,
        )

    @classmethod
    def from_dense(cls, dense: np.ndarray, first_row: int = 0) -> SparseRows:
        dense = np.asarray(dense, dtype=np.float32)
        rows, cols = np.nonzero(dense)
        vals = dense[rows, cols]
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
        binary = bool(np.all(vals == 1.0))
        return cls(
            dense.shape[1],
            indptr,
            cols.astype(index_dtype(dense.shape[1])),
            None if binary else vals,
            first_row,
        )
