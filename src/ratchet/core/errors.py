"""ratchet's errors: one base, and one mark for the errors a user fixes.

`RatchetError` is the base of every error ratchet raises on purpose. A `UserError` is
phrased for the person at the terminal: one line that names the file, key or cause and
says what to do. The CLI prints a UserError as that one line and exits 2, whichever
command met it; anything else escaping is a bug in ratchet and keeps its traceback.
This is the one list of user errors: a room that wants its error shown to the user
extends `UserError`, and nothing else has to change.

Standard library only: the job side may import it too.
"""

from __future__ import annotations


class RatchetError(Exception):
    """The base of every error ratchet raises on purpose."""


class UserError(RatchetError):
    """A problem the user must fix, phrased as one line naming the cause and the fix."""


class InfrastructureError(UserError):
    """A backend, cluster or service that does not answer: never a candidate's fault,
    and everything is recorded, so fixing it and running again resumes."""


class HardStop(RatchetError):
    """A second Ctrl-C stopped the study at once: a proposer call in flight is not waited
    for (it is recorded as interrupted, spend.py) and nothing it would have made is used.
    Not a user error: the study catches it and stops as the user asked."""
