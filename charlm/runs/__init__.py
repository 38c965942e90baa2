"""A run directory: its files and lock (directory), its records (records), provenance, TensorBoard."""
