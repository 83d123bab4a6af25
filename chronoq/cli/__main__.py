"""``python -m chronoq.cli``: the ``chronoq`` command."""

from chronoq.cli import main

main()
