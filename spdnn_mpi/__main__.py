"""``python -m spdnn_mpi`` runs the ``spdnn`` command line."""

from spdnn_mpi.cli import main

raise SystemExit(main())
