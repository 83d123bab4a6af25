"""An outage of one kind of call, logged when it starts and when it ends (with the count of
failed attempts), instead of a line per failure."""

from __future__ import annotations

import logging

from chronoq import errors


class Outage:
    """Calls of one kind (``what``) failing and working again, told on ``log``."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.failures = 0
        self._log = log

    def failed(self, err: Exception) -> None:
        if not self.failures:
            if isinstance(err, errors.ChronoqError):
                self._log.warning("%s failing, retrying: %s", self.what, err)
            else:  # not an outage: a bug, which needs its traceback
                self._log.error("%s failing, retrying: %r", self.what, err, exc_info=err)
        self.failures += 1

    def ended(self) -> None:
        if self.failures:
            self._log.warning(
                "%s working again after %d failed attempts", self.what, self.failures
            )
            self.failures = 0
