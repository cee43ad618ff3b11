"""``python -m lmqd.lookupd``: the same command as the ``lmqlookupd`` console script."""

from lmqd.lookupd.cli import main

if __name__ == "__main__":
    main()
