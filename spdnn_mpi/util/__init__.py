"""Small shared utilities: atomic writes, output checks, paths, memory, progress, caches."""
