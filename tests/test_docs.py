"""The docs keep up with the code: every kernel setting is in docs/design.md with its
default, every environment variable the package, the tools and the job scripts read
is documented, and the docs speak of the product, not of how it was made."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.comm import LAUNCHER_VARIABLES

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Set by the shell or the system, not by a user of these scripts.
SYSTEM_VARIABLES = {"PWD", "SECONDS", "EPOCHREALTIME", "PIPESTATUS", "USER", "HOME", "TMPDIR",
                    "PYTHONPATH"}
#: Set by Slurm inside a job (read by the job scripts to size and name things).
SLURM_SET = re.compile(r"SLURM_[A-Z_]+$")


def config_table() -> dict[str, str]:
    """field -> default column of the KernelConfig table in docs/design.md."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("### Configuration", 1)[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `([a-z0-9_]+)` \| ([^|]+?) \|", section, re.M))


def test_design_names_every_kernel_setting_with_its_default():
    table = config_table()
    fields = {f.name: f.default for f in dataclasses.fields(KernelConfig)}
    assert set(table) == set(fields), (sorted(set(fields) - set(table)),
                                       sorted(set(table) - set(fields)))
    for name, default in fields.items():
        assert table[name] == str(default), (name, table[name], default)


def python_reads(text: str) -> set[str]:
    """Environment variable names a Python source reads or sets a default for."""
    pattern = (r"(?:environ\.get|environ\.setdefault|getenv)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
               r"|environ\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\]")
    return {a or b for a, b in re.findall(pattern, text)}


def shell_reads(text: str) -> set[str]:
    """Names a shell script takes from its environment: expanded and never assigned in
    the script, or assigned only a default of their own (``X=${X:-default}``)."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", code))
    bare = re.sub(r"\"(?:[^\"\\\\\n]|\\\\.)*\"|'[^'\n]*'", '""', code)  # not NAME= in a string
    assigned = set(re.findall(r"(?:^|[\s;(&|])(?:export\s+|local\s+)?([A-Z][A-Z0-9_]*)=", bare,
                              re.M))
    for names in re.findall(r"\bread\s+(?:-\w+\s+)*((?:[A-Za-z_]\w*[ \t]*)+)", code):
        assigned |= set(names.split())
    own_default = {a for a, b in re.findall(r"\b([A-Z][A-Z0-9_]*)=\"?\$\{([A-Z][A-Z0-9_]*):?-",
                                             code) if a == b}
    return used - (assigned - own_default)


def read_variables(folder: str) -> dict[str, set[str]]:
    """Variable -> the files of ``folder`` that read it."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / folder).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        text = path.read_text(errors="replace")
        names = python_reads(text) if path.suffix == ".py" else (
            shell_reads(text) if path.suffix in (".sh", ".sbatch") or text.startswith("#!")
            else set())
        for name in names:
            if name not in SYSTEM_VARIABLES and not SLURM_SET.match(name):
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_scanner_finds_known_variables():
    package = read_variables("spdnn_mpi")
    assert {"SPDNN_CACHE_DIR", "NUMBA_CACHE_DIR", "SPDNN_DEBUG", "OMP_WAIT_POLICY"} <= set(package)
    assert {"SPDNN_STORE", "SPDNN_BACKEND", "SPDNN_STAGE"} <= set(read_variables("jobs"))
    assert {"STEPS", "SPDNN_CHALLENGE_URL", "NVCC"} <= set(read_variables("tools"))


def test_every_environment_variable_read_is_documented():
    readme = (REPO / "README.md").read_text()
    slurm = (REPO / "docs" / "slurm.md").read_text()
    missing = []
    for folder, docs in (("spdnn_mpi", readme), ("tools", readme), ("jobs", readme + slurm)):
        for name, files in sorted(read_variables(folder).items()):
            if not re.search(rf"\b{name}\b", docs):
                missing.append(f"{name} ({', '.join(sorted(files))})")
    for name, _ in LAUNCHER_VARIABLES:  # read to tell whether a launcher started us
        if name not in readme:
            missing.append(f"{name} (spdnn_mpi/comm.py LAUNCHER_VARIABLES)")
    assert not missing, "not documented in README.md (jobs/: or docs/slurm.md): " + \
        "; ".join(missing)


def test_docs_speak_of_the_product_not_of_how_it_was_made():
    words = re.compile(r"\b[Ss]ession \d+|\bwas lent\b|\bdevice call|\bv(?:[1-9]|1[0-9])\b"
                       r"|earlier measurements")
    hits = [f"{doc.relative_to(REPO)}:{n}: {line.strip()}"
            for doc in DOCS for n, line in enumerate(doc.read_text().splitlines(), 1)
            if words.search(line) and "cgroup" not in line]  # cgroup v1/v2: not ours
    assert not hits, hits


def test_readme_names_no_removed_tool():
    text = (REPO / "README.md").read_text()
    for gone in ("tools/convert_tree.py", "tools/cpu_shared_sums.py", "kernel sweeps",
                 "spdnn_mpi.peers.gpu", "design_notes"):
        assert gone not in text, gone
    for tool in re.findall(r"tools/([\w.]+\.(?:py|sh))", text):
        assert (REPO / "tools" / tool).is_file(), tool
