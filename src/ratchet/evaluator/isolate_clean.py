"""The module a clean child holds: no candidate code at all.

`CandidateProcess.empty_request_s` times its empty requests on a child started exactly
like the candidate's (same interpreter, same sandbox) but holding this module instead, so
nothing the candidate answers enters the correction the harness subtracts from its times.
"""


def noop(*args: object, **kwargs: object) -> None:
    """Does nothing; the request that names it is pure round trip."""
