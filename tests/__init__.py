"""lmq's test suite: one package per area, shared helpers in ``tests.support``."""
