"""lmq's test suite: one package per area, shared helpers in ``tests.support``.

Every folder is a package, so modules are ``tests.<area>.test_<name>`` and names repeat freely
across areas. No folder is named like a stdlib module (``httpapi``, not ``http``): run from
inside ``tests/`` with ``python -m pytest``, such a package would shadow the stdlib's.
"""
