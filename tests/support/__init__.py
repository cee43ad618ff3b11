"""What the test areas share, one home each (fixtures are registered by ``tests/conftest.py``):

- ``daemon``: the in-process daemon (``start_daemon`` fixture, ``RunningDaemon``), serving a
  connection over a memory stream, and ``eventually`` for daemon state without an event;
- ``process``: ``lmqd`` in a subprocess (``LmqdProcess``), also used by the bench scripts;
- ``wire``: the V2 client over the sans-IO ``ClientConnection`` (``Wire``, ``connect`` fixture);
- ``rawbytes``: commands as bytes and a blocking raw-socket client, for bad input;
- ``http``: an h11 HTTP/1.1 client that shows every byte the server sent;
- ``faults``: ``os.fsync`` held or failing in worker threads (``fsync`` fixture), a full disk
  (``disk`` fixture);
- ``diskquota``: ``os.pwrite`` under a size limit, in process or around an lmqd subprocess.
"""
