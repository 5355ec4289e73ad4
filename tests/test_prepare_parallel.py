"""``spdnn prepare`` on several cores and from the official archive: the same store as one
core from the folder, errors naming file and line, nothing left behind when stopped."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import fixed_degree_layer, random_inputs, random_network

from spdnn_mpi.cli import main
from spdnn_mpi.formats.tsv import layers as tsv_layers
from spdnn_mpi.formats.tsv import write as tsv_write

N = 16
L = 9


@pytest.fixture(autouse=True)
def one_layer_a_batch(monkeypatch):
    """Each layer file its own batch, so that these small networks keep every worker
    busy (by default they would fit one batch, and one worker)."""
    monkeypatch.setattr(tsv_layers, "BATCH_BYTES", 1)


@pytest.fixture
def tree(tmp_path) -> dict:
    """An official-layout tree of L layers of N neurons, 30 images, truth for 4 and L layers."""
    rng = np.random.default_rng(0)
    net = random_network(rng, [N] * (L + 1), density=0.3)
    for layer in net.layers:  # every neuron used, as iter_layers checks
        assert layer.indices.max() == N - 1 and np.diff(layer.indptr)[-1] > 0
    root = tmp_path / "tree"
    tsv_write.write_tree(root, net, random_inputs(rng, 30, N),
                         {4: np.array([1, 7, 30]), L: np.array([7])})
    return {"root": root, "weights": root / f"neuron{N}", "net": net}


def make_archive(weights: Path, dest: Path, *, order=None, extra=(), gz_member=None) -> Path:
    """``neuron{N}.tar.gz`` of a folder, members in ``order`` (default: shuffled)."""
    files = sorted(weights.iterdir())
    if order is None:
        random.Random(3).shuffle(files)
    else:
        files = [weights / name for name in order]
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(weights, arcname=weights.name, recursive=False)
        for f in files:
            if f.name == gz_member:
                data = gzip.compress(f.read_bytes())
                info = tarfile.TarInfo(f"{weights.name}/{f.name}.gz")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(f, arcname=f"{weights.name}/{f.name}")
        for name, data in extra:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def contents(path: Path) -> dict:
    """Every dataset's bytes and every attribute of a store, timestamps left out."""
    found = {}

    def visit(name, obj):
        for key, value in obj.attrs.items():
            if key == "created":
                continue
            if key == "provenance":
                found[f"{name}@{key}"] = {k: v for k, v in json.loads(value).items()
                                          if k != "prepared"}
            else:
                found[f"{name}@{key}"] = repr(value)
        if isinstance(obj, h5py.Dataset):
            found[name] = (obj.dtype.str, obj.shape, obj[()].tobytes())

    with h5py.File(path, "r") as f:
        visit("/", f)
        f.visititems(visit)
    return found


def prepare(*argv) -> int:
    return main(["prepare", "--quiet", *map(str, argv)])


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_two_workers_write_the_same_store_as_one(tree, tmp_path):
    root = tree["root"]
    common = ["--weights", tree["weights"], "--inputs", root / f"sparse-images-{N}.tsv",
              "--categories", root / f"neuron{N}-l4-categories.tsv",
              "--truth-layers", "6"]
    assert prepare(*common, "--jobs", 1, "--out", tmp_path / "one.h5") == 0
    assert prepare(*common, "--jobs", 2, "--out", tmp_path / "two.h5") == 0
    assert prepare(*common, "--jobs", 5, "--out", tmp_path / "five.h5") == 0
    one = contents(tmp_path / "one.h5")
    assert one["network/layers"][1] == (L,) and one["network/indices16"][1][0] > 0
    assert contents(tmp_path / "two.h5") == one
    assert contents(tmp_path / "five.h5") == one


def test_batches_keep_order_and_shrink_to_single_layers_at_the_end():
    """Layer files go to workers in lists of at most the limit; the last lists take a
    share of what is left, so no worker is left with a long list while the other idles."""
    sizes = [100] * 50
    tasks = list(range(50))
    whole = list(tsv_layers._batches(iter(tasks), sizes, 1000))
    assert [len(b) for b in whole] == [10] * 5
    shared = list(tsv_layers._batches(iter(tasks), sizes, 1000, share=4))
    assert [t for b in shared for t in b] == tasks
    assert max(len(b) for b in shared) == 10 and len(shared[-1]) == 1
    lengths = [len(b) for b in shared]
    assert lengths == sorted(lengths, reverse=True)
    big = list(tsv_layers._batches(iter(range(3)), [5000, 10, 10], 1000))
    assert big == [[0], [1, 2]]  # a file beyond the limit goes alone


def test_truth_computed_on_the_cpu_from_layers_parsed_by_workers(tmp_path):
    """Layers of one shape parsed by workers arrive in buffers the CPU backend lays out
    together (``model.stacked_indices``): its truth must be the reference's."""
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.model import Network
    from spdnn_mpi.reference import reference_categories

    rng = np.random.default_rng(3)
    n = 64
    layers = [fixed_degree_layer(rng, n, n, 8) for _ in range(6)]
    for layer in layers:  # every neuron used, as iter_layers checks
        layer.indices[-1] = n - 1
    root = tmp_path / "tree"
    rows = random_inputs(rng, 40, n)
    tsv_write.write_tree(root, Network(layers), rows, {})
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}.h5"
        assert prepare("--weights", root / f"neuron{n}", "--inputs",
                       root / f"sparse-images-{n}.tsv", "--truth-layers", 6,
                       "--truth-backend", "cpu", "--jobs", jobs, "--out", out) == 0
        with Store(out) as st:
            np.testing.assert_array_equal(st.truth(6),
                                          reference_categories(st.network(6), st.inputs()))


@pytest.mark.parametrize("jobs", [1, 2])
def test_archive_gives_the_folder_store(tree, tmp_path, jobs):
    archive = make_archive(tree["weights"], tmp_path / f"neuron{N}.tar.gz", gz_member="n16-l3.tsv")
    assert prepare("--weights", tree["weights"], "--jobs", 1, "--out", tmp_path / "dir.h5") == 0
    assert prepare("--weights", archive, "--jobs", jobs, "--out", tmp_path / "tar.h5") == 0
    folder, packed = contents(tmp_path / "dir.h5"), contents(tmp_path / "tar.h5")
    prov_f, prov_a = folder.pop("/@provenance"), packed.pop("/@provenance")
    assert packed == folder
    assert prov_a["source"]["weights_archive"] == str(archive.resolve())
    assert prov_a["source"]["layer_files"] == f"neuron{N}/n{N}-l1.tsv .. neuron{N}/n{N}-l{L}.tsv"
    assert prov_a["layers"] == prov_f["layers"] == L
    # --layers takes the first layers whatever the member order
    assert prepare("--weights", archive, "--layers", 4, "--out", tmp_path / "four.h5") == 0
    assert prepare("--weights", tree["weights"], "--layers", 4, "--out", tmp_path / "f4.h5") == 0
    four, folder4 = contents(tmp_path / "four.h5"), contents(tmp_path / "f4.h5")
    assert four.pop("/@provenance")["layers"] == folder4.pop("/@provenance")["layers"] == 4
    assert four == folder4
    (tmp_path / "f4.h5").unlink()
    assert leftovers(tmp_path) == ["dir.h5", "four.h5", f"neuron{N}.tar.gz", "tar.h5", "tree"]


def test_archive_layers_wait_on_disk_beyond_the_memory_budget(tree, tmp_path, monkeypatch):
    """Members in reverse order: every layer waits for layer 1; past the budget on disk."""
    names = [f"n{N}-l{k}.tsv" for k in range(L, 0, -1)]
    archive = make_archive(tree["weights"], tmp_path / "net.tar.gz", order=names)
    seen = []
    real_load = tsv_layers.pickle.load

    def load(f):
        seen.append(Path(f.name).parent)
        return real_load(f)

    monkeypatch.setattr(tsv_layers, "HELD_BYTES", 3000)
    monkeypatch.setattr(tsv_layers.pickle, "load", load)
    out = tmp_path / "out" / "s.h5"
    assert prepare("--weights", archive, "--neurons", N, "--jobs", 2, "--out", out) == 0
    assert prepare("--weights", tree["weights"], "--out", tmp_path / "dir.h5") == 0
    packed, folder = contents(out), contents(tmp_path / "dir.h5")
    assert packed.pop("/@provenance")["layers"] == folder.pop("/@provenance")["layers"] == L
    assert packed == folder
    assert seen and all(p.parent == out.parent for p in seen)  # scratch beside the output
    assert leftovers(out.parent) == ["s.h5"]  # and removed


def test_archive_progress_counts_layers_written(tree, tmp_path, capsys):
    archive = make_archive(tree["weights"], tmp_path / f"neuron{N}.tar.gz")
    assert main(["prepare", "--weights", str(archive), "--out", str(tmp_path / "s.h5")]) == 0
    err = capsys.readouterr().err
    assert f"all layers of N={N} from {archive}" in err
    assert f"layer {L}/{L}" in err


def _bad_line(tree):
    path = tree["weights"] / f"n{N}-l5.tsv"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "3\tthree\t0.5\n"
    path.write_text("".join(lines))
    return f"n{N}-l5.tsv:3: output neuron j is not an integer"


def _other_network(tree):
    path = tree["weights"] / f"n{N}-l6.tsv"
    path.write_text("1\t1\t0.5\n")
    return f"n{N}-l6.tsv: layer uses neurons up to i=1, j=1 but the network has N={N}"


@pytest.mark.parametrize("jobs", [1, 2, 3])
@pytest.mark.parametrize("damage", [_bad_line, _other_network])
def test_worker_errors_name_file_and_line(tree, tmp_path, capsys, jobs, damage):
    fragment = damage(tree)
    out_dir = tmp_path / "out"
    for weights in (tree["weights"],
                    make_archive(tree["weights"], tmp_path / f"neuron{N}.tar.gz")):
        rc = main(["prepare", "--weights", str(weights), "--jobs", str(jobs), "--out",
                   str(out_dir / "s.h5")])
        err = capsys.readouterr().err
        if jobs > 1:  # the layers were parsed elsewhere than in the main thread
            how = "parse threads" if weights.is_file() else "worker processes"
            assert f"({jobs} {how})" in err, err
        if weights.is_file():  # archive[member]:line
            fragment = f"neuron{N}.tar.gz[neuron{N}/" + fragment.replace(".tsv:", ".tsv]:")
        assert rc == 2 and fragment in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) <= 3  # the start line, maybe progress, the error
        assert leftovers(out_dir) == []


def _member_tar(tree, tmp_path, **kw):
    return make_archive(tree["weights"], tmp_path / f"neuron{N}.tar.gz", **kw)


@pytest.mark.parametrize("case, fragment", [
    ("truncated", f"neuron{N}.tar.gz: truncated"),
    ("corrupt", f"neuron{N}.tar.gz: corrupt or not a tar archive"),
    ("checksum", "incorrect data check"),
    ("not_tar", "n16-l1.tsv.gz: corrupt or not a tar archive"),
    ("stray", f"neuron{N}.tar.gz[neuron{N}/README]: not a layer file"),
    ("other_n", f"neuron{N}.tar.gz[neuron{N}/n64-l1.tsv]: a layer of N=64, but the network "
                f"has N={N}"),
    ("twice", f"neuron{N}.tar.gz[neuron{N}/n{N}-l2.tsv.gz]: layer 2 given twice"),
    ("gap", f"neuron{N}.tar.gz: missing layer file (no member n{N}-l4.tsv or n{N}-l4.tsv.gz), "
            f"but layers 5..{L} are there; pass --layers 3"),
    ("too_few", f"neuron{N}.tar.gz: missing layer file (no member n{N}-l{L + 1}.tsv"),
    ("truth_beyond", f"--truth-layers [{L + 2}] outside 1..{L}"),
])
def test_archive_refusals_are_one_line(tree, tmp_path, capsys, case, fragment):
    extra_args = []
    w = tree["weights"]
    if case in ("truncated", "corrupt", "checksum"):
        archive = _member_tar(tree, tmp_path)
        data = bytearray(archive.read_bytes())
        if case == "truncated":
            data = data[: len(data) * 2 // 3]
        elif case == "checksum":  # the CRC of the whole stream, in its last 8 bytes
            data[-8] ^= 0xFF
        else:
            data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
        archive.write_bytes(bytes(data))
    elif case == "not_tar":
        archive = tmp_path / "n16-l1.tsv.gz"
        archive.write_bytes(gzip.compress((w / "n16-l1.tsv").read_bytes()))
        extra_args = ["--neurons", str(N)]
    elif case == "stray":
        archive = _member_tar(tree, tmp_path, extra=[(f"neuron{N}/README", b"hello\n")])
    elif case == "other_n":
        archive = _member_tar(tree, tmp_path, extra=[(f"neuron{N}/n64-l1.tsv", b"1\t1\t1\n")])
    elif case == "twice":
        archive = _member_tar(tree, tmp_path, extra=[
            (f"neuron{N}/n{N}-l2.tsv.gz", gzip.compress((w / f"n{N}-l2.tsv").read_bytes()))])
    elif case == "gap":
        (w / f"n{N}-l4.tsv").unlink()
        archive = _member_tar(tree, tmp_path)
    elif case == "too_few":
        archive = _member_tar(tree, tmp_path)
        extra_args = ["--layers", str(L + 1)]
    else:
        archive = _member_tar(tree, tmp_path)
        extra_args = ["--truth-layers", str(L + 2), "--inputs",
                      str(tree["root"] / f"sparse-images-{N}.tsv")]
    out_dir = tmp_path / "out"
    rc = main(["prepare", "--weights", str(archive), *extra_args, "--jobs", "2", "--out",
               str(out_dir / "s.h5")])
    err = capsys.readouterr().err
    assert rc == 2 and fragment in err and "Traceback" not in err, err
    assert leftovers(out_dir) == []


def _processes_of_group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the workers")
@pytest.mark.parametrize("sig, group, packed", [
    (signal.SIGINT, True, False), (signal.SIGTERM, False, False), (signal.SIGTERM, True, False),
    (signal.SIGINT, True, True), (signal.SIGTERM, False, True)])
def test_stopped_parallel_prepare_leaves_nothing(tmp_path, sig, group, packed):
    """Stopped while its workers parse (Ctrl-C in a terminal signals the whole group,
    `kill` the command, a batch system's cancel the group): exits, the workers end with
    it, no file is left."""
    rng = np.random.default_rng(0)
    net = random_network(rng, [256] * 61, density=0.25)  # 3 batches of layer files
    tsv_write.write_tree(tmp_path / "tree", net)
    weights = tmp_path / "tree" / "neuron256"
    if packed:  # members parsed in threads, the archive read in another
        weights = make_archive(weights, tmp_path / "neuron256.tar.gz")
    out_dir = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "spdnn_mpi", "prepare", "--weights", str(weights),
         "--jobs", "2", "--out", str(out_dir / "s.h5")],
        stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (out_dir.exists() and any(out_dir.iterdir())):  # the store is being written
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    assert len(_processes_of_group(proc.pid)) >= (1 if packed else 3)  # and its two workers
    (os.killpg if group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + signal.SIGTERM), err
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while _processes_of_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_of_group(proc.pid) == []
    assert leftovers(out_dir) == []


def test_jobs_must_be_positive(tree, tmp_path, capsys):
    assert main(["prepare", "--weights", str(tree["weights"]), "--jobs", "0", "--out",
                 str(tmp_path / "s.h5")]) == 2
    assert "--jobs 0: must be at least 1" in capsys.readouterr().err


def test_output_is_never_a_layer_file_or_the_archive(tree, tmp_path, capsys):
    victim = tree["weights"] / f"n{N}-l7.tsv"
    link = tmp_path / "link.h5"
    link.symlink_to(victim)
    archive = make_archive(tree["weights"], tmp_path / f"neuron{N}.tar.gz")
    for weights, out in [(tree["weights"], link), (archive, archive)]:
        before = Path(out).read_bytes()
        assert main(["prepare", "--weights", str(weights), "--out", str(out), "--force"]) == 2
        err = capsys.readouterr().err
        assert "refusing to write over an input" in err, err
        assert Path(out).read_bytes() == before


def test_gzip_stream_of_several_members_and_zero_padding(tmp_path):
    """An archive compressed in pieces (``cat a.gz b.gz``) and padded with zeros, as
    gzip itself reads it; anything else after the stream is refused."""
    from spdnn_mpi.formats.tsv import archive as tsv_archive

    payload = bytes(range(256)) * 5000
    packed = gzip.compress(payload[:1000]) + gzip.compress(payload[1000:]) + bytes(4096)
    stream = tsv_archive._decompressed(io.BytesIO(packed))
    assert stream.read() == payload
    with pytest.raises(OSError, match="not gzip"):
        tsv_archive._decompressed(io.BytesIO(gzip.compress(payload) + b"junk")).read()
    with pytest.raises(EOFError):
        tsv_archive._decompressed(io.BytesIO(gzip.compress(payload)[:-3])).read()


def test_numba_is_imported_only_to_parse(tree, tmp_path):
    """Locating a folder's layer files and prepare's checks without truth or inputs
    files import no numba, so the inputs made in the background overlap its import
    (0.3 s); the parser's warm-up imports it."""
    script = f"""
import sys
from spdnn_mpi.formats.tsv.layers import open_layers, warm_kernels
from spdnn_mpi.formats.tsv.to_store import _read_inputs
source = open_layers({str(tree["weights"])!r})
source.sources({str(tmp_path / "out.h5")!r}), source.useful_jobs(2), list(source)
assert _read_inputs(None, None, {{}}, source.neurons, False, 0.0) == ({{}}, None)
print("numba" in sys.modules, end=" ")
warm_kernels()
print("numba" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.split() == ["False", "True"], out.stderr
