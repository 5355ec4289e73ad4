"""Official TSV files: round trips, the real 1024 network, and every bad-input case."""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path

import numpy as np
import pytest
from conftest import challenge_dir, random_inputs, random_network
from hypothesis import given, settings
from hypothesis import strategies as st

from spdnn_mpi.errors import InputFormatError, SpdnnError
from spdnn_mpi.formats.tsv import read as tsv
from spdnn_mpi.formats.tsv import tree as tsv_tree
from spdnn_mpi.formats.tsv import write as tsv_write
from spdnn_mpi.model import Layer, Network, SparseRows


def assert_same_layer(a: Layer, b: Layer) -> None:
    assert (a.n_in, a.n_out) == (b.n_in, b.n_out)
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices.astype(np.int64), b.indices.astype(np.int64))
    np.testing.assert_array_equal(a.weight_values(), b.weight_values())
    assert (a.values is None) == (b.values is None)


def assert_same_rows(a: SparseRows, b: SparseRows) -> None:
    assert (a.n_rows, a.n_cols) == (b.n_rows, b.n_cols)
    np.testing.assert_array_equal(a.to_dense(), b.to_dense())
    assert (a.values is None) == (b.values is None)


# ---------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("widths", [[7, 7, 7], [5, 11, 3, 8], [1, 4, 1]])
def test_layer_round_trip(tmp_path, widths, gz):
    rng = np.random.default_rng(len(widths) + 10 * gz)
    for uniform in (False, True):
        net = random_network(rng, widths, density=0.4, uniform=uniform)
        for k, layer in enumerate(net.layers):
            path = tmp_path / f"l{k}-{uniform}.tsv{'.gz' if gz else ''}"
            tsv_write.write_layer(path, layer)
            back = tsv.read_layer(path, layer.n_in, layer.n_out, bias=layer.bias, clip=layer.clip)
            assert_same_layer(layer, back)
            assert back.bias == layer.bias and back.clip == layer.clip


@settings(max_examples=40, deadline=None)
@given(
    n_in=st.integers(1, 40),
    n_out=st.integers(1, 40),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
    block=st.sampled_from([8, 13, 64, 1 << 20]),
)
def test_layer_round_trip_property(tmp_path_factory, n_in, n_out, density, seed, block):
    """Any shape and values survive write -> read, whatever the parse block size."""
    rng = np.random.default_rng(seed)
    mask = rng.random((n_in, n_out)) < density
    i, j = np.nonzero(mask)
    vals = rng.standard_normal(len(i)).astype(np.float32) * np.float32(10.0) ** rng.integers(
        -30, 30, len(i)
    ).astype(np.float32)
    if len(i) == 0:
        return
    layer = Layer.from_coo(i, j, vals, n_in, n_out)
    path = tmp_path_factory.mktemp("p") / "layer.tsv"
    tsv_write.write_layer(path, layer)
    assert_same_layer(layer, tsv.read_layer(path, n_in, n_out, block_bytes=block))


def test_layer_written_like_official(tmp_path):
    layer = Layer.from_coo([0, 1, 0], [0, 0, 2], [1 / 16] * 3, 2, 3)
    path = tmp_path / "n.tsv"
    tsv_write.write_layer(path, layer)
    # ordered by output j, then input i; 1-based; %.6e like the official files
    assert path.read_text() == "1\t1\t6.250000e-02\n2\t1\t6.250000e-02\n1\t3\t6.250000e-02\n"


def test_layer_any_line_order(tmp_path):
    lines = ["3\t2\t0.5", "1\t1\t1", "2\t2\t-2", "1\t2\t4"]
    path = tmp_path / "l.tsv"
    path.write_text("\n".join(lines) + "\n")
    layer = tsv.read_layer(path, 3, 2)
    np.testing.assert_array_equal(layer.indptr, [0, 1, 4])
    np.testing.assert_array_equal(layer.indices, [0, 0, 1, 2])
    np.testing.assert_array_equal(layer.values, [1, 4, -2, 0.5])


@pytest.mark.parametrize(
    "text, value",
    [
        ("6.250000e-02", 0.0625),
        ("1", 1.0),
        ("1.", 1.0),
        (".5", 0.5),
        ("-2.5E+01", -25.0),
        ("+3e-2", 0.03),
        ("0.000", 0.0),
        ("123456789012345678901234", 1.2345679e23),
        ("0.0000000000000000000000001234", 1.234e-25),
        ("1.17549435e-38", 1.17549435e-38),
    ],
)
def test_value_formats(tmp_path, text, value):
    path = tmp_path / "l.tsv"
    path.write_text(f"1\t1\t{text}\n")
    assert tsv.read_layer(path, 1, 1).weight_values()[0] == np.float32(value)


def test_whitespace_tolerance(tmp_path):
    """Trailing blank lines, CRLF and space separators are accepted."""
    path = tmp_path / "l.tsv"
    path.write_bytes(b"1\t1\t0.5\r\n2 1  0.5\r\n\n\n")
    layer = tsv.read_layer(path, 2, 1)
    assert layer.nnz == 2 and layer.uniform_value == 0.5


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("order", ["row-major", "pixel-major", "shuffled"])
def test_images_round_trip(tmp_path, binary, order):
    rng = np.random.default_rng(3)
    rows = random_inputs(rng, 40, 25, density=0.15, binary=binary)
    path = tmp_path / "sparse-images-25.tsv.gz"
    tsv_write.write_images(path, rows)
    if order != "row-major":
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        if order == "shuffled":
            rng.shuffle(lines)
        else:  # as MATLAB's find(Y) writes them: by pixel, then image
            lines.sort(key=lambda t: (int(t.split()[1]), int(t.split()[0])))
        path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    for block in (16, 1 << 20):
        back = tsv.read_images(path, 25, 40, block_bytes=block)
        assert_same_rows(rows, back)
        assert back.indices.dtype == np.uint16
        ids = back.indices.astype(np.int64)
        assert all(np.all(np.diff(ids[lo:hi]) > 0) for lo, hi in zip(back.indptr, back.indptr[1:]))
    # without n_rows the count is the largest image id; more rows may be asked for
    last = int(np.flatnonzero(np.diff(rows.indptr))[-1]) + 1
    assert tsv.read_images(path, 25).n_rows == last
    assert tsv.read_images(path, 25, 50).n_rows == 50


def test_images_file_format(tmp_path):
    rows = SparseRows.from_dense(np.array([[0, 1, 1], [0, 0, 0], [1, 0, 0]], np.float32))
    path = tmp_path / "img.tsv"
    tsv_write.write_images(path, rows)
    assert path.read_text() == "1\t2\t1\n1\t3\t1\n3\t1\t1\n"
    back = tsv.read_images(path, 3, 3)
    assert back.values is None and back.indices.dtype == np.uint16


def test_categories_round_trip(tmp_path):
    path = tmp_path / "neuron8-l3-categories.tsv"
    tsv_write.write_categories(path, np.array([9, 2, 5]))
    assert path.read_text() == "2\n5\n9\n"
    np.testing.assert_array_equal(tsv.read_categories(path), [2, 5, 9])
    empty = tmp_path / "empty.tsv"
    tsv_write.write_categories(empty, np.array([], dtype=np.int64))
    assert len(tsv.read_categories(empty)) == 0


def test_write_tree_and_scan(tmp_path):
    rng = np.random.default_rng(5)
    net = random_network(rng, [16, 16, 16, 16], density=0.3)
    rows = random_inputs(rng, 30, 16)
    written = tsv_write.write_tree(tmp_path, net, rows, {2: np.array([1, 4]), 3: np.array([4])})
    assert written["weights"] == tmp_path / "neuron16"
    assert sorted(p.name for p in (tmp_path / "neuron16").iterdir()) == [
        "n16-l1.tsv",
        "n16-l2.tsv",
        "n16-l3.tsv",
    ]
    (found,) = tsv_tree.scan_tree(tmp_path)
    assert (found.neurons, found.n_layers) == (16, 3)
    assert found.images == tmp_path / "sparse-images-16.tsv"
    assert sorted(found.categories) == [2, 3]
    for k, layer in enumerate(tsv_tree.iter_layers(found.weights_dir, 16, 3, check_full=False)):
        assert_same_layer(net.layers[k], layer)
    assert_same_rows(rows, tsv.read_images(found.images, 16, 30))
    np.testing.assert_array_equal(tsv.read_categories(found.categories[2]), [1, 4])


def test_write_tree_compressed_from_generator(tmp_path):
    net = random_network(np.random.default_rng(6), [8, 8, 8], uniform=True)
    tsv_write.write_tree(tmp_path, iter(net.layers), compress=True)
    path = tsv_tree.layer_path(tmp_path / "neuron8", 8, 2)
    assert path.name == "n8-l2.tsv.gz"
    assert_same_layer(net.layers[1], tsv.read_layer(path, 8, 8))


def test_write_tree_is_atomic(tmp_path):
    net = random_network(np.random.default_rng(7), [8, 8, 8])

    def layers():
        yield net.layers[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        tsv_write.write_tree(tmp_path, layers())
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SpdnnError, match="8 x 8"):
        small = Network(random_network(np.random.default_rng(1), [8, 4]).layers)
        tsv_write.write_tree(tmp_path, small)
    with pytest.raises(SpdnnError, match="inputs have 5 columns"):
        tsv_write.write_tree(tmp_path, net, random_inputs(np.random.default_rng(1), 3, 5))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# the real 1024-neuron network
# ---------------------------------------------------------------------------
def test_real_network(real_dir):
    assert tsv_tree.count_layers(real_dir, 1024) == 120
    assert tsv_tree.infer_neurons(real_dir) == 1024
    for layer in tsv_tree.iter_layers(real_dir, 1024, 120, bias=-0.3, clip=32.0):
        assert layer.nnz == 32 * 1024
        assert layer.row_degree == 32  # every output neuron j has 32 inputs
        assert np.all(np.bincount(layer.indices, minlength=1024) == 32)  # every input i
        assert layer.values is None and layer.uniform_value == 1 / 16


def test_real_first_layer_structure(real_dir):
    """Layer 1: input i feeds the outputs j with j mod 64 in {i mod 64, (i-1) mod 64}."""
    layer = tsv.read_layer(tsv_tree.layer_path(real_dir, 1024, 1), 1024, 1024)
    j = np.repeat(np.arange(1024), 32)
    i = layer.indices.astype(np.int64)
    assert np.all(((j - i) % 64 == 0) | ((j - i + 1) % 64 == 0))


def test_real_categories():
    path = challenge_dir() / "neuron1024-l120-categories.tsv"
    if not path.is_file():
        pytest.skip(f"official categories not found at {path} (set SPDNN_CHALLENGE_DIR)")
    ids = tsv.read_categories(path)
    assert len(ids) == 1812 and np.all(np.diff(ids) > 0) and ids[0] >= 1


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------
GOOD = "1\t1\t0.5\n2\t1\t0.5\n1\t2\t0.5\n"

LAYER_CASES = [
    # (content, line, message fragment)
    (GOOD + "2\t2\n", 4, "expected 3 tab-separated fields"),
    (GOOD + "2\t2\t0.5\t1\n", 4, "found 4"),
    ("1\tx\t0.5\n", 1, "output neuron j is not an integer"),
    (GOOD + "2.0\t2\t0.5\n", 4, "input neuron i is not an integer"),
    (GOOD + "2\t2\tabc\n", 4, "value is not a number"),
    (GOOD + "2\t2\tnan\n", 4, "value is not a number"),
    (GOOD + "2\t2\t1e\n", 4, "value is not a number"),
    (GOOD + "2\t2\t1e39\n", 4, "float32 range"),
    (GOOD + "0\t2\t0.5\n", 4, "not a 1-based id"),
    (GOOD + "2\t-1\t0.5\n", 4, "not a 1-based id"),
    (GOOD + "3\t2\t0.5\n", 4, "input neuron i 3 is beyond"),
    (GOOD + "2\t9\t0.5\n", 4, "output neuron j 9 is beyond"),
    (GOOD + "\n2\t2\t0.5\n", 4, "blank line in the middle"),
    ("\n" + GOOD, 1, "blank line in the middle"),
    (GOOD + "2\t2\t0.5\n1\t2\t0.25\n", 5, "(i, j) = (1, 2), already given on line 3"),
    ("2\t2\t1\n1\t1\t1\n2\t1\t1\n1\t1\t3\n2\t2\t1\n", 4, "already given on line 2"),
]


@pytest.mark.parametrize("content, line, fragment", LAYER_CASES)
@pytest.mark.parametrize("gz", [False, True])
def test_bad_layer(tmp_path, content, line, fragment, gz):
    path = tmp_path / ("l.tsv.gz" if gz else "l.tsv")
    data = content.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    for block in (5, 1 << 20):
        with pytest.raises(InputFormatError) as info:
            tsv.read_layer(path, 2, 2, block_bytes=block)
        assert info.value.line == line, str(info.value)
        assert fragment in info.value.message
        assert info.value.path == str(path)
        assert str(info.value).startswith(f"{path}:{line}: ")


def _gz_lines(n: int) -> bytes:
    return gzip.compress("".join(f"{i}\t1\t0.5\n" for i in range(1, n + 1)).encode())


def _readable_lines(path: Path) -> int:
    """Complete lines of a damaged gzip file, read one byte at a time until it fails."""
    text = bytearray()
    with gzip.open(path, "rb") as f, contextlib.suppress(EOFError, OSError):
        while byte := f.read(1):
            text += byte
    return text.count(b"\n")


@pytest.mark.parametrize("block_bytes", [4096, None])
def test_truncated_gzip(tmp_path, block_bytes):
    """The error names the line where the text ends, whatever the block size (a block
    read fails as a whole: the first block of a big one would otherwise say line 1)."""
    data = _gz_lines(20000)
    path = tmp_path / "l.tsv.gz"
    path.write_bytes(data[: len(data) // 2])
    kw = {} if block_bytes is None else {"block_bytes": block_bytes}
    with pytest.raises(InputFormatError, match="truncated gzip") as info:
        tsv.read_layer(path, 20000, 1, **kw)
    assert info.value.line == _readable_lines(path) + 1
    assert 5000 < info.value.line < 15000


def test_corrupt_gzip(tmp_path):
    data = bytearray(_gz_lines(20000))
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "l.tsv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(InputFormatError, match="corrupt gzip") as info:
        tsv.read_layer(path, 20000, 1, block_bytes=4096)
    assert info.value.line is not None


def test_not_gzip_but_named_gz(tmp_path):
    """The format is sniffed, so a plain file named .gz still reads."""
    path = tmp_path / "l.tsv.gz"
    path.write_text(GOOD)
    assert tsv.read_layer(path, 2, 2).nnz == 3


def test_missing_files(tmp_path):
    with pytest.raises(InputFormatError, match="missing layer file") as info:
        tsv_tree.layer_path(tmp_path, 1024, 3)
    assert info.value.path.endswith("n1024-l3.tsv")
    with pytest.raises(InputFormatError, match="no such file"):
        tsv.read_layer(tmp_path / "nope.tsv", 2, 2)
    with pytest.raises(InputFormatError, match="no such file"):
        tsv.read_images(tmp_path / "nope.tsv", 2)


def test_layer_of_another_network(tmp_path):
    """A smaller network's layer in the folder has ids in range but the wrong N."""
    d = tmp_path / "neuron8"
    d.mkdir()
    full = random_network(np.random.default_rng(2), [8, 8], density=1.0).layers[0]
    small = random_network(np.random.default_rng(2), [4, 4], density=1.0).layers[0]
    tsv_write.write_layer(d / "n8-l1.tsv", full)
    tsv_write.write_layer(d / "n8-l2.tsv", small)
    layers = tsv_tree.iter_layers(d, 8, 2)
    next(layers)
    with pytest.raises(InputFormatError, match="N=8: it belongs to a different network") as info:
        next(layers)
    assert info.value.path.endswith("n8-l2.tsv")
    # a bigger network's layer fails on its first out-of-range line
    with pytest.raises(InputFormatError, match="beyond the 4 allowed"):
        tsv.read_layer(d / "n8-l1.tsv", 4, 4)


def test_missing_layer_in_sequence(tmp_path):
    d = tmp_path / "neuron8"
    d.mkdir()
    layer = random_network(np.random.default_rng(2), [8, 8], density=1.0).layers[0]
    tsv_write.write_layer(d / "n8-l1.tsv", layer)
    tsv_write.write_layer(d / "n8-l3.tsv", layer)
    # a gap is an error naming the missing file, not the end of the network
    with pytest.raises(InputFormatError, match=r"n8-l2\.tsv: missing layer file.*layers 3\.\.3"):
        tsv_tree.count_layers(d, 8)
    with pytest.raises(InputFormatError, match="n8-l2.tsv: missing layer file"):
        tsv_tree.scan_tree(tmp_path)
    assert tsv_tree.count_layers(d, 8, gaps_ok=True) == 1
    with pytest.raises(InputFormatError, match="missing layer file"):
        list(tsv_tree.iter_layers(d, 8, 3))


@pytest.mark.parametrize(
    "content, line, fragment",
    [
        ("1\t1\t1\n1\t2\t1\n1\t2\t1\n", 3, "(image, pixel) = (1, 2), already given on line 2"),
        ("2\t1\t1\n1\t2\t1\n2\t1\t1\n", 3, "(image, pixel) = (2, 1), already given on line 1"),
        ("1\t1\t1\n1\t5\t1\n", 2, "pixel 5 is beyond"),
        ("1\t1\t1\n4\t1\t1\n", 2, "image 4 is beyond"),
        ("1\t1\t1\n0\t1\t1\n", 2, "image 0 is not a 1-based id"),
        ("1\t1\n", 1, "expected 3"),
    ],
)
def test_bad_images(tmp_path, content, line, fragment):
    path = tmp_path / "sparse-images-4.tsv"
    path.write_text(content)
    with pytest.raises(InputFormatError) as info:
        tsv.read_images(path, 4, 3, block_bytes=8)
    assert info.value.line == line and fragment in info.value.message, str(info.value)


@pytest.mark.parametrize(
    "content, line, fragment",
    [
        ("3\n5\n3\n", 3, "duplicate image id 3"),
        ("3\n0\n", 2, "not a 1-based id"),
        ("3\n4\t5\n", 2, "expected 1"),
        ("3\nx\n", 2, "not an integer"),
        ("3\n\n4\n", 2, "blank line"),
        ("3\n11\n", 2, "beyond the 10 allowed"),
    ],
)
def test_bad_categories(tmp_path, content, line, fragment):
    path = tmp_path / "neuron4-l2-categories.tsv"
    path.write_text(content)
    with pytest.raises(InputFormatError) as info:
        tsv.read_categories(path, n_images=10)
    assert info.value.line == line and fragment in info.value.message, str(info.value)


def test_block_boundaries_do_not_matter(tmp_path):
    """Errors and results are the same whatever the block size."""
    rng = np.random.default_rng(9)
    layer = random_network(rng, [30, 30], density=0.5).layers[0]
    path = tmp_path / "l.tsv"
    tsv_write.write_layer(path, layer)
    lines = path.read_text().splitlines()
    lines[200] = lines[200].replace("\t", " \t ", 1)  # still fine
    lines[300] = "1\t1"
    path.write_text("\n".join(lines) + "\n")
    for block in (1, 3, 17, 100, 1 << 20):
        with pytest.raises(InputFormatError) as info:
            tsv.read_layer(path, 30, 30, block_bytes=block)
        assert info.value.line == 301


def test_layer_path_prefers_plain(tmp_path):
    layer = Layer.from_coo([0], [0], [1.0], 1, 1)
    tsv_write.write_layer(tmp_path / "n1-l1.tsv.gz", layer)
    assert tsv_tree.layer_path(tmp_path, 1, 1).name == "n1-l1.tsv.gz"
    tsv_write.write_layer(tmp_path / "n1-l1.tsv", layer)
    assert tsv_tree.layer_path(tmp_path, 1, 1).name == "n1-l1.tsv"
    assert isinstance(tsv_tree.layer_path(tmp_path, 1, 1), Path)


# ---------------------------------------------------------------------------
# a cut file, stray image ids
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block", [3, 1 << 20])
def test_file_cut_inside_its_last_value_is_refused(tmp_path, gz, block):
    """A cut ``6.25e-02`` reads as the valid 6.25: only the missing line break shows it."""
    text = "1\t1\t6.250000e-02\n2\t1\t6.250000e-02\n1\t2\t6.25"
    path = tmp_path / ("n2-l1.tsv.gz" if gz else "n2-l1.tsv")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    with pytest.raises(InputFormatError) as info:
        tsv.read_layer(path, 2, 2, block_bytes=block)
    assert info.value.line == 3 and "no line break" in info.value.message
    images = tmp_path / "sparse-images-2.tsv"
    images.write_text("1\t1\t1\n2\t2\t1")
    with pytest.raises(InputFormatError, match="sparse-images-2.tsv:2: the last line"):
        tsv.read_images(images, 2)
    cats = tmp_path / "neuron2-l1-categories.tsv"
    cats.write_text("1\n30")  # cut from 3001
    with pytest.raises(InputFormatError, match="categories.tsv:2: the last line has no line"):
        tsv.read_categories(cats)
    # complete files: a final newline, CRLF, trailing blank lines or spaces are all fine
    for ending in ("\n", "\r\n", "\n\n", "\n  \t"):
        path.write_text(text + ending)
        assert tsv.read_layer(path, 2, 2, block_bytes=block).nnz == 3
    cats.write_text("")
    assert len(tsv.read_categories(cats)) == 0


def _images_text(ids: list[int]) -> str:
    return "".join(f"{i}\t{1 + i % 3}\t1\n" for i in ids)


@pytest.mark.parametrize("stray_first", [False, True])  # row-major, or order broken
def test_stray_image_id_needs_images(tmp_path, stray_first):
    ids = list(range(1, 2001))
    ids = [10**6] + ids if stray_first else ids + [10**6]
    path = tmp_path / "sparse-images-4.tsv"
    path.write_text(_images_text(ids))
    with pytest.raises(InputFormatError) as info:
        tsv.read_images(path, 4)
    assert info.value.line == (1 if stray_first else 2001)
    assert "image id 1000000 is far beyond the 2001 distinct" in info.value.message
    assert "--images 1000000" in info.value.message
    rows = tsv.read_images(path, 4, 10**6)  # said so: accepted
    assert rows.n_rows == 10**6 and rows.nnz == 2001


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_sparse_but_sound_image_ids_are_accepted(tmp_path, order):
    path = tmp_path / "sparse-images-4.tsv"
    cases = [list(range(2, 20001, 2)),  # every other image: half of them empty
             [1, 900],  # few images, fewer than STRAY_EMPTY_IMAGES empty
             list(range(1, 3001)) + [5000]]
    for ids in cases:
        path.write_text(_images_text(ids if order == "sorted" else ids[::-1]))
        assert tsv.read_images(path, 4).n_rows == max(ids)


def test_huge_stray_id_costs_no_memory(tmp_path):
    """An id of 3 x 10^8 first (unordered file): refused before any array of that size."""
    import tracemalloc

    path = tmp_path / "sparse-images-4.tsv"
    path.write_text(_images_text([3 * 10**8] + list(range(1, 5001))))
    tracemalloc.start()
    try:
        with pytest.raises(InputFormatError, match="image id 300000000 is far beyond"):
            tsv.read_images(path, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, f"peak {peak / 1e6:.0f} MB"  # 3 x 10^8 int64 counts: 2.4 GB
