"""The HDF5 store: schema, reader with validation, atomic writer."""
