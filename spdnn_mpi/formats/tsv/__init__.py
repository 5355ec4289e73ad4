"""Official Sparse DNN Graph Challenge TSV files: reading, locating, writing, converting."""
