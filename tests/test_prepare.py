"""``spdnn prepare`` and ``spdnn info``: TSV tree -> store -> arrays, and clean failures."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import random_inputs, random_network

from spdnn_mpi.cli import main
from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store.reader import Store, StoreWriter
from spdnn_mpi.formats.tsv import write as tsv_write
from spdnn_mpi.model import Layer

N = 16


@pytest.fixture
def tree(tmp_path) -> dict:
    """A small official-layout tree: 4 layers of N=16, 30 images, truth for 2 and 4 layers."""
    rng = np.random.default_rng(11)
    net = random_network(rng, [N] * 5, density=0.3)
    # every neuron used, as in a challenge network (iter_layers checks the extent)
    for layer in net.layers:
        assert layer.indices.max() == N - 1 and np.diff(layer.indptr)[-1] > 0
    rows = random_inputs(rng, 30, N)
    root = tmp_path / "tree"
    tsv_write.write_tree(root, net, rows, {2: np.array([1, 7, 30]), 4: np.array([7])})
    return {"root": root, "net": net, "rows": rows, "weights": root / f"neuron{N}"}


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_prepare_round_trip(tree, tmp_path, capsys):
    out = tmp_path / "out" / "net.h5"
    root = tree["root"]
    rc = main(
        [
            "prepare",
            "--weights", str(tree["weights"]),
            "--inputs", str(root / f"sparse-images-{N}.tsv"),
            "--categories", str(root / f"neuron{N}-l2-categories.tsv"),
            "--categories", f"4={root / f'neuron{N}-l4-categories.tsv'}",
            "--bias", "-0.25",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    assert "layer 4/4" in capsys.readouterr().err
    with Store(out) as store:
        assert store.n_layers == 4
        for k, layer in enumerate(tree["net"].layers):
            got = store.layer(k)
            np.testing.assert_array_equal(got.indptr, layer.indptr)
            np.testing.assert_array_equal(got.indices, layer.indices)
            np.testing.assert_array_equal(got.weight_values(), layer.weight_values())
            assert got.bias == np.float32(-0.25) and got.clip == 32.0
        np.testing.assert_array_equal(store.inputs().to_dense(), tree["rows"].to_dense())
        assert store.truth_layers() == [2, 4]
        np.testing.assert_array_equal(store.truth(2), [1, 7, 30])
        assert store.provenance["tool"] == "spdnn prepare"
        assert store.provenance["source"]["categories"]["4"].endswith("l4-categories.tsv")


def test_a_given_truth_file_is_not_called_official(tree, tmp_path, capsys):
    """prepare cannot know where a --categories file came from: the store (and so
    `spdnn info`) says it was given to prepare, by name."""
    out = tmp_path / "net.h5"
    root = tree["root"]
    mine = tmp_path / "my-truth.tsv"
    mine.write_bytes((root / f"neuron{N}-l4-categories.tsv").read_bytes())
    assert main(["prepare", "--weights", str(tree["weights"]), "--inputs",
                 str(root / f"sparse-images-{N}.tsv"), "--categories", f"4={mine}",
                 "--out", str(out), "--quiet"]) == 0
    with Store(out) as store:
        assert store.truth_source(4) == "categories file given to prepare: my-truth.tsv"
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(categories file given to prepare: my-truth.tsv)" in text
    assert "official" not in text


def test_prepare_options(tree, tmp_path, capsys):
    out = tmp_path / "net.h5"
    argv = ["prepare", "--weights", str(tree["weights"]), "--layers", "2", "--no-clip"]
    assert main([*argv, "--quiet", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    with Store(out) as store:
        assert store.n_layers == 2 and not store.has_inputs
        layer = store.layer(1)
        assert layer.clip is None
        assert layer.bias == np.float32(-0.30 - 0.05 * np.log(N / 1024) / np.log(4))
    # an existing store is kept unless --force
    assert main([*argv, "--quiet", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--quiet", "--force", "--layers", "3", "--out", str(out)]) == 0
    with Store(out) as store:
        assert store.n_layers == 3


def test_info(tree, tmp_path, capsys):
    out = tmp_path / "net.h5"
    root = tree["root"]
    main(
        [
            "prepare", "--quiet", "--weights", str(tree["weights"]), "--out", str(out),
            "--inputs", str(root / f"sparse-images-{N}.tsv"),
            "--categories", str(root / f"neuron{N}-l4-categories.tsv"),
        ]
    )  # fmt: skip
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 layers, 16 -> 16 neurons" in text
    assert "30 images" in text and "binary" in text
    assert "4 layers: 1 surviving images" in text
    assert "tool: spdnn prepare" in text
    assert main(["info", "--json", "-", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_layers"] == 4 and info["images"] == 30
    assert info["truth"]["4"]["survivors"] == 1
    assert info["input_nnz"] == tree["rows"].nnz
    assert main(["info", str(tmp_path / "missing.h5")]) == 2


def test_prepare_real_network(real_dir, tmp_path, capsys):
    out = tmp_path / "n1024.h5"
    assert main(["prepare", "--weights", str(real_dir), "--layers", "12", "--out", str(out)]) == 0
    assert "layer 12/12" in capsys.readouterr().err
    with Store(out) as store:
        assert store.n_layers == 12
        assert store.provenance["neurons"] == 1024
        for k in range(12):
            layer = store.layer(k)
            assert layer.row_degree == 32 and layer.uniform_value == 1 / 16
            assert np.all(np.bincount(layer.indices, minlength=1024) == 32)
            assert layer.bias == np.float32(-0.30) and layer.clip == 32.0
    # 12 layers at 2 bytes per index plus metadata
    assert out.stat().st_size < 12 * 32768 * 2 * 1.2


# ---------------------------------------------------------------------------
# failures: exit 2, a message naming file and line, nothing left behind
# ---------------------------------------------------------------------------
def _corrupt_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _bad_layer_line(tree):
    _corrupt_line(tree["weights"] / f"n{N}-l3.tsv", 5, "7\tseven\t0.5")
    return [], f"n{N}-l3.tsv:5: output neuron j is not an integer"


def _zero_based(tree):
    _corrupt_line(tree["weights"] / f"n{N}-l2.tsv", 2, "0\t1\t0.5")
    return [], f"n{N}-l2.tsv:2: input neuron i 0 is not a 1-based id"


def _duplicate(tree):
    path = tree["weights"] / f"n{N}-l1.tsv"
    first = path.read_text().splitlines()[0]
    path.write_text(path.read_text() + first + "\n")
    n = len(path.read_text().splitlines())
    return [], f"n{N}-l1.tsv:{n}: duplicate entry"


def _missing_layer(tree):
    (tree["weights"] / f"n{N}-l3.tsv").unlink()
    return ["--layers", "4"], f"n{N}-l3.tsv: missing layer file"


def _layer_file_is_a_directory(tree):
    path = tree["weights"] / f"n{N}-l2.tsv"
    path.unlink()
    path.mkdir()
    return [], f"n{N}-l2.tsv: is a directory, not a layer file"


def _truncated_gzip(tree):
    path = tree["weights"] / f"n{N}-l2.tsv"
    data = gzip.compress(path.read_bytes())
    path.unlink()
    path.with_name(path.name + ".gz").write_bytes(data[: len(data) - 20])
    return [], (f"n{N}-l2.tsv.gz:", "gzip data")


def _other_network(tree):
    small = random_network(np.random.default_rng(1), [8, 8], density=1.0).layers[0]
    tsv_write.write_layer(tree["weights"] / f"n{N}-l4.tsv", small)
    return [], "it belongs to a different network"


def _bad_images(tree):
    path = tree["root"] / f"sparse-images-{N}.tsv"
    _corrupt_line(path, 3, "2\t17\t1")
    return ["--inputs", str(path)], f"sparse-images-{N}.tsv:3: pixel 17 is beyond"


def _bad_categories(tree):
    path = tree["root"] / f"neuron{N}-l2-categories.tsv"
    path.write_text("1\n7\n1\n")
    return ["--categories", str(path)], f"neuron{N}-l2-categories.tsv:3: duplicate image id 1"


def _truth_beyond_layers(tree):
    path = tree["root"] / f"neuron{N}-l4-categories.tsv"
    return ["--layers", "3", "--categories", str(path)], "is for 4 layers but the store gets 3"


def _truth_beyond_images(tree):
    root = tree["root"]
    return [
        "--inputs", str(root / f"sparse-images-{N}.tsv"), "--images", "20",
        "--categories", str(root / f"neuron{N}-l2-categories.tsv"),
    ], "image id 30 is beyond the 20 allowed"  # fmt: skip


def _unnamed_categories(tree):
    path = tree["root"] / "truth.tsv"
    path.write_text("1\n")
    return ["--categories", str(path)], "write it as L=FILE"


def _gap_without_layers(tree):
    (tree["weights"] / f"n{N}-l3.tsv").unlink()  # 1, 2 and 4 remain
    return [], (f"n{N}-l3.tsv: missing layer file", "layers 4..4 are there", "--layers 2")


def _cut_last_value(tree):
    path = tree["weights"] / f"n{N}-l4.tsv"
    text = path.read_text()
    path.write_text(text[: len(text) - 5])  # cut inside the last value
    n = len(text.splitlines())
    return [], (f"n{N}-l4.tsv:{n}: the last line has no line break",)


def _stray_image_id(tree):
    path = tree["root"] / f"sparse-images-{N}.tsv"
    path.write_text(path.read_text() + "1000000	3	1\n")
    n = len(path.read_text().splitlines())
    return ["--inputs", str(path)], (f"sparse-images-{N}.tsv:{n}: image id 1000000 is far "
                                     "beyond the", "--images 1000000")


def _empty_images(tree):
    """A 0-image store was written; with --categories the refusal blamed the truth file."""
    path = tree["root"] / "empty.tsv"
    path.write_text("")
    return ["--inputs", str(path)], f"{path}: no images (the file has no entry lines)"


def _blank_images_with_categories(tree):
    path = tree["root"] / "blank.tsv"
    path.write_text("\n\n")
    truth = tree["root"] / f"neuron{N}-l2-categories.tsv"
    return ["--inputs", str(path), "--categories", str(truth)], (
        f"{path}: no images (the file has no entry lines)")


def _argument(*argv: str, fragment: str):
    def case(tree):
        return list(argv), fragment
    case.__name__ = "_" + "_".join(argv)
    return case


def _truth_for_other_inputs(tree):
    """Official truth with generated inputs: accepted silently before, and --check then
    failed with 1711 missing and 2755 extra on the real network."""
    path = tree["root"] / f"neuron{N}-l2-categories.tsv"
    return ["--generate-inputs", "--categories", str(path)], (
        "truth files belong to the official inputs", "--truth-layers")


def _truth_layers_with_no_truth_backend(tree):
    return ["--generate-inputs", "--truth-layers", "2", "--truth-backend", "none"], (
        "--truth-backend none computes no truth")


@pytest.mark.parametrize(
    "case",
    [
        _argument("--bias", "nan", fragment="--bias nan: must be a finite number"),
        _argument("--bias", "inf", fragment="--bias inf: must be a finite number"),
        _argument("--bias=-inf", fragment="--bias -inf: must be a finite number"),
        _argument("--clip", "nan", fragment="--clip nan: must be a finite number > 0"),
        _argument("--clip", "inf", fragment="--clip inf: must be a finite number > 0"),
        _argument("--clip", "0", fragment="--clip 0.0: must be a finite number > 0"),
        _argument("--clip", "-2", fragment="--clip -2.0: must be a finite number > 0"),
        _argument("--bias", "1e39", fragment="--bias 1e+39: must be a finite number as "
                                             "float32"),
        _argument("--clip", "1e39", fragment="--clip 1e+39: must be a finite number > 0 as "
                                             "float32"),
        _argument("--images", "0", fragment="--images 0: must be at least 1"),
        _argument("--generate-inputs", "--images", "0", fragment="--images 0: must be at least"),
        _argument("--generate-inputs", "--images", "-5", fragment="--images -5: must be at"),
        _gap_without_layers,
        _cut_last_value,
        _stray_image_id,
        _truth_for_other_inputs,
        _truth_layers_with_no_truth_backend,
        _bad_layer_line,
        _zero_based,
        _duplicate,
        _missing_layer,
        _layer_file_is_a_directory,
        _truncated_gzip,
        _other_network,
        _bad_images,
        _bad_categories,
        _truth_beyond_layers,
        _truth_beyond_images,
        _unnamed_categories,
        _empty_images,
        _blank_images_with_categories,
    ],
)
def test_prepare_fails_cleanly(tree, tmp_path, capsys, case):
    extra, fragment = case(tree)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc = main(
        ["prepare", "--weights", str(tree["weights"]), "--out", str(out_dir / "s.h5"), *extra]
    )
    err = capsys.readouterr().err
    assert rc == 2
    for part in (fragment,) if isinstance(fragment, str) else fragment:
        assert part in err, err
    assert "Traceback" not in err
    assert leftovers(out_dir) == []


def test_store_writer_is_atomic(tmp_path):
    final = tmp_path / "s.h5"
    layer = Layer.from_coo([0, 1], [1, 0], [1.0, 2.0], 2, 2)
    with pytest.raises(RuntimeError), StoreWriter(final) as writer:
        writer.add_layer(layer)
        raise RuntimeError("interrupted in the middle")
    assert leftovers(tmp_path) == []
    with pytest.raises(StoreError):
        Store(final)
    # an existing store survives a failed rewrite untouched
    with StoreWriter(final) as writer:
        writer.add_layer(layer)
    before = final.read_bytes()
    with pytest.raises(KeyboardInterrupt), StoreWriter(final) as writer:
        writer.add_layer(layer)
        writer.add_layer(layer)
        raise KeyboardInterrupt
    assert final.read_bytes() == before and leftovers(tmp_path) == ["s.h5"]


def test_prepare_real_network_with_generated_inputs_and_truth(tmp_path):
    """The CPU benchmark's store: real weights, MNIST-derived inputs, computed truth."""
    from conftest import challenge_dir

    from spdnn_mpi.reference import reference_categories

    weights = challenge_dir() / "neuron1024"
    if not weights.is_dir():
        pytest.skip(f"real challenge network not found at {weights}")
    out = tmp_path / "real.h5"
    assert main(["prepare", "--weights", str(weights), "--layers", "8", "--generate-inputs",
                 "--images", "600", "--truth-layers", "4,8", "--truth-backend", "cpu",
                 "--out", str(out), "--quiet"]) == 0
    with Store(out) as st:
        assert st.truth_layers() == [4, 8] and st.n_images == 600
        assert st.truth_source(8) == "cpu"
        np.testing.assert_array_equal(
            st.truth(8), reference_categories(st.network(8), st.inputs()))
    assert main(["prepare", "--weights", str(weights), "--layers", "8", "--generate-inputs",
                 "--truth-layers", "9", "--out", str(tmp_path / "bad.h5"), "--quiet"]) == 2
    assert not (tmp_path / "bad.h5").exists()


def test_store_without_inputs_says_how_to_add_them(tree, tmp_path, capsys):
    out = tmp_path / "weights-only.h5"
    assert main(["prepare", "--weights", str(tree["weights"]), "--out", str(out), "--quiet"]) == 0
    assert main(["infer", str(out), "--quiet", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "store has no inputs" in err
    assert "--inputs sparse-images-N.tsv" in err and "--generate-inputs" in err
    assert "spdnn import" not in err  # a challenge store: not the model hint


def test_prepare_tree_converts_every_network(tree, tmp_path, capsys):
    """--tree: one store per N with all layers, its images and every truth file."""
    out_dir = tmp_path / "stores"
    assert main(["prepare", "--tree", str(tree["root"]), "--out-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    store = out_dir / f"neuron{N}-l4.h5"
    assert captured.out.split() == [str(store)]
    assert "store 1/1: N=16, 4 layers of neuron16, 2 truth file(s)" in captured.err
    assert "layer 4/4" in captured.err
    with Store(store) as st:
        assert st.n_layers == 4 and st.truth_layers() == [2, 4]
        np.testing.assert_array_equal(st.inputs().to_dense(), tree["rows"].to_dense())
        np.testing.assert_array_equal(st.truth(2), [1, 7, 30])
    # an existing store stops the run before anything is read, unless --force
    assert main(["prepare", "--tree", str(tree["root"]), "--out-dir", str(out_dir),
                 "--quiet"]) == 2
    assert "--out-dir" in capsys.readouterr().err
    assert main(["prepare", "--tree", str(tree["root"]), "--out-dir", str(out_dir),
                 "--quiet", "--force", "--neurons", "16"]) == 0


def _archive_tree(tree, tmp_path) -> Path:
    """The tree with its neuron{N} folder replaced by the archive as downloaded."""
    import shutil
    import tarfile

    with tarfile.open(tree["root"] / f"neuron{N}.tar.gz", "w:gz") as tar:
        tar.add(tree["weights"], arcname=tree["weights"].name)
    shutil.rmtree(tree["weights"])
    return tree["root"]


def test_prepare_tree_takes_the_archives_as_downloaded(tree, tmp_path, capsys):
    """--tree with neuron{N}.tar.gz in place of the folder: the same store, read as deep
    as its deepest truth file; --split one store per truth file; without truth, all
    layers into neuron{N}.h5."""
    folder_store = tmp_path / "folder" / f"neuron{N}-l4.h5"
    assert main(["prepare", "--tree", str(tree["root"]), "--out-dir",
                 str(folder_store.parent), "--quiet"]) == 0
    root = _archive_tree(tree, tmp_path)
    out_dir = tmp_path / "stores"
    assert main(["prepare", "--tree", str(root), "--out-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    assert f"4 layers of neuron{N}.tar.gz, 2 truth file(s)" in captured.err
    with Store(out_dir / f"neuron{N}-l4.h5") as a, Store(folder_store) as b:
        assert a.n_layers == 4 and a.truth_layers() == [2, 4]
        for la, lb in zip(a.network().layers, b.network().layers):
            np.testing.assert_array_equal(la.indices, lb.indices)
            np.testing.assert_array_equal(la.indptr, lb.indptr)
        np.testing.assert_array_equal(a.inputs().to_dense(), tree["rows"].to_dense())
    assert main(["prepare", "--tree", str(root), "--out-dir", str(tmp_path / "split"),
                 "--split", "--quiet"]) == 0
    assert leftovers(tmp_path / "split") == [f"neuron{N}-l2.h5", f"neuron{N}-l4.h5"]
    for truth in root.glob("*categories*"):
        truth.unlink()
    assert main(["prepare", "--tree", str(root), "--out-dir", str(tmp_path / "bare"),
                 "--quiet"]) == 0
    with Store(tmp_path / "bare" / f"neuron{N}.h5") as st:
        assert st.n_layers == 4 and st.truth_layers() == []


def test_prepare_tree_split_makes_one_store_per_truth_file(tree, tmp_path, capsys):
    out_dir = tmp_path / "stores"
    assert main(["prepare", "--tree", str(tree["root"]), "--out-dir", str(out_dir), "--split",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert sorted(p.name for p in out_dir.iterdir()) == [f"neuron{N}-l2.h5", f"neuron{N}-l4.h5"]
    with Store(out_dir / f"neuron{N}-l2.h5") as st:
        assert st.n_layers == 2 and st.truth_layers() == [2]


@pytest.mark.parametrize("argv, fragment", [
    (["--tree", "{missing}", "--out-dir", "{out}"], "--tree {missing}: no such folder"),
    (["--tree", "{root}"], "--tree {root} needs --out-dir DIR"),
    (["--tree", "{root}", "--out-dir", "{out}", "--neurons", "1024", "4096"],
     "no neuron{N} folder with layer files and no neuron{N}.tar.gz archive for --neurons "
     "1024 4096"),
    (["--tree", "{root}", "--out-dir", "{out}", "--inputs", "x.tsv", "--layers", "2"],
     "--layers, --inputs: for one network (--weights DIR)"),
    (["--tree", "{root}", "--out-dir", "{out}", "--no-clip"], "--clip/--no-clip: for one"),
    (["--tree", "{root}", "--out-dir", "{out}", "--out", "x.h5"], "--out: for one network"),
    (["--tree", "{root}", "--out-dir", "{file}"], "--out-dir {file} exists and is not a"),
    (["--weights", "{weights}"], "--weights needs --out STORE"),
    (["--weights", "{weights}", "--out", "{out}/s.h5", "--out-dir", "{out}"],
     "--out-dir goes with --tree DIR"),
    (["--weights", "{weights}", "--out", "{out}/s.h5", "--split"], "--split goes with --tree"),
    (["--weights", "{weights}", "--out", "{out}/s.h5", "--neurons", "16", "32"],
     "--neurons 16 32: one N with --weights"),
])
def test_prepare_tree_errors_name_the_argument(tree, tmp_path, capsys, argv, fragment):
    names = {"missing": tmp_path / "nowhere", "out": tmp_path / "out", "root": tree["root"],
             "weights": tree["weights"], "file": tmp_path / "a-file", "N": "{N}"}
    (tmp_path / "a-file").write_text("")
    argv = [a.format(**names) for a in argv]
    assert main(["prepare", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment.format(**names) in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_prepare_takes_weights_or_tree_not_both(tree, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "--weights", str(tree["weights"]), "--tree", str(tree["root"]),
              "--out", str(tmp_path / "s.h5")])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prepare", "--out", str(tmp_path / "s.h5")])
    assert "one of the arguments --weights --tree is required" in capsys.readouterr().err


def test_formats_never_import_the_generators():
    """Readers and writers of files stay below the generators: --generate-inputs is wired
    in the command (commands/prepare.py hands prepare_store a function)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "spdnn_mpi" / "formats"
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}: {n}" for n in names if n.startswith("spdnn_mpi.generators")]
    assert not bad, bad


def test_unreadable_weights_folder_is_one_line(tree, tmp_path, capsys, monkeypatch):
    """Listing a folder without read permission raised PermissionError (tests run as root,
    where permissions do not stop a read: the listing is made to fail instead)."""
    from pathlib import Path as RealPath

    real_iterdir = RealPath.iterdir
    weights = tree["weights"]

    def iterdir(self):
        if self == weights:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(RealPath, "iterdir", iterdir)
    out = tmp_path / "s.h5"
    assert main(["prepare", "--weights", str(weights), "--neurons", str(N), "--out", str(out),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"spdnn prepare: error: {weights}: cannot list the folder (Permission " \
                  "denied)\n"
    assert not out.exists()


def test_categories_and_truth_layers_for_the_same_count_refused(tree, tmp_path, capsys):
    """Both gave truth for 2 layers: h5py's "name already exists" traceback at the end."""
    root, out = tree["root"], tmp_path / "s.h5"
    assert main(["prepare", "--weights", str(tree["weights"]), "--inputs",
                 str(root / f"sparse-images-{N}.tsv"), "--categories",
                 str(root / f"neuron{N}-l2-categories.tsv"), "--truth-layers", "2",
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--truth-layers 2: truth for 2 layers is given by --categories" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_store_writer_refuses_a_second_truth_for_one_count(tmp_path):
    layer = Layer.from_coo([0, 1], [1, 0], [1.0, 2.0], 2, 2)
    with pytest.raises(StoreError, match="truth/l1: stored twice"), \
            StoreWriter(tmp_path / "s.h5") as writer:
        writer.add_layer(layer)
        writer.add_truth(1, np.array([1]), "a")
        writer.add_truth(1, np.array([1]), "b")
    assert leftovers(tmp_path) == []
