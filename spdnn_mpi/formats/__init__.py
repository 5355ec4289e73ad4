"""File formats and importers: the official TSV files and the HDF5 store."""
