"""Errors a user can cause or meet, each printed as one line by the CLI (never a traceback)."""


class WirespeedError(Exception):
    """Base of every error wirespeed reports to a user. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(WirespeedError):
    """Bad input: an unknown name, a size that does not parse, a combination that cannot run here."""

    exit_code = 2


class BackendUnavailable(UsageError):
    """The chosen backend cannot run on this machine; the message says why and how to get it."""


class PeerTimeout(WirespeedError):
    """A collective made no progress within the timeout: a peer died, hangs or is unreachable."""

    exit_code = 3


class CheckFailed(WirespeedError):
    """At least one collective produced a wrong element."""

    exit_code = 1
