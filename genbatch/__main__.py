"""`python -m genbatch ...` is the `gen` command (used by the launcher and torchrun)."""

from genbatch.cli import main

if __name__ == "__main__":
    main()
