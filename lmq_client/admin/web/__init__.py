"""``lmqadmin web``: lmq's web console (docs/console.md); ``command.py`` is the entry."""
