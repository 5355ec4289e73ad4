"""Other implementations run on the same data for comparison (GraphBLAS, cuSPARSE, torch)."""
