"""``python -m spdnn_mpi`` runs the ``spdnn`` command line."""

from spdnn_mpi.cli import entry

raise SystemExit(entry())
