"""Storage tests: the trio-free disk queue on real files under tmp_path."""
