"""HTTP API tests: nsqd's endpoints and /metrics against an in-process daemon."""
