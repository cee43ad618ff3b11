"""``python -m lmq_client.admin``: the same as the ``lmqadmin`` console script."""

from lmq_client.admin.cli import main

main()
