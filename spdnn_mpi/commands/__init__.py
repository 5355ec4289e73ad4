"""The ``spdnn`` subcommands, one module each (``add_arguments`` and ``run``)."""
