"""GPU tests (a package, so that its conftest is ``gpu.conftest`` and does not
shadow tests/conftest.py, whose helpers these tests import as ``conftest``)."""
