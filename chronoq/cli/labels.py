"""Labels on the command line: ``--label k=v``, repeatable, parsed into a mapping.

The node bounds them (``chronoq.limits.check_labels``); here only the form is checked, so a
malformed option is one red line naming it, not a request."""

from __future__ import annotations

from collections.abc import Sequence

import typer


def parse_labels(values: Sequence[str] | None, option: str = "--label") -> dict[str, str]:
    """``["team=billing", "tier=gold"]`` as ``{"team": "billing", "tier": "gold"}``; a value
    without ``=`` or a key given twice is refused naming ``option``."""
    out: dict[str, str] = {}
    for value in values or ():
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{value!r} is not KEY=VALUE", param_hint=option)
        if key in out:
            raise typer.BadParameter(f"label {key!r} is given twice", param_hint=option)
        out[key] = text
    return out
