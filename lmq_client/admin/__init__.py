"""``lmqadmin``, the command line for lmqd and nsqd (click + rich); see docs/cli.md."""
