"""``python -m lmqd``: the same command as the ``lmqd`` console script."""

from lmqd.cli import main

if __name__ == "__main__":
    main(prog_name="lmqd")
