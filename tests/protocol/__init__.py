"""Protocol tests: the sans-IO V2 codec, fed whole, byte by byte and with trailing data."""
