"""The ``talkloop`` program (and ``python -m talkloop``): :func:`talkloop.pipeline.cli.main`,
with library noise turned off before the libraries load."""

from __future__ import annotations

import sys

from talkloop.pipeline.console import quiet_for


def main() -> int:
    words = sys.argv[1:]
    with quiet_for(words):
        # lazy: torch and transformers read their log levels when first imported, so the quiet
        # environment must be in place before the command line (which imports them) loads.
        from talkloop.pipeline.cli import main as run

        return run(words)


if __name__ == "__main__":
    sys.exit(main())
