"""Server tests: the TCP connection handler over in-memory streams."""
