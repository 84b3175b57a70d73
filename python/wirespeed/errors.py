"""Errors a user can cause or meet, each printed as one line by the CLI (never a traceback).

Each kind of failure has its own exit status (docs/failures.md), the same on every rank and for
the whole job whichever rank saw the fault first:

    0  success
    1  wrong results (a collective returned wrong data), or a failure of no kind below
    2  usage error: bad input, refused before anything runs; or a limit of the machine the job
       cannot run within (a hard open-file limit too low for the wirespeed backend's connections)
    3  timeout: no progress within --timeout (a peer hangs, is stopped, unreachable, never came)
    4  peer lost: a peer process died or its connection closed
    5  mismatch: ranks called different collectives, sizes, dtypes or settings
"""

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_PEER_LOST = 4
EXIT_MISMATCH = 5

# What each status means, for the launcher's last line and the docs.
EXIT_MEANING = {EXIT_FAILED: "failed", EXIT_USAGE: "usage error",
                EXIT_TIMEOUT: "timeout: no progress within --timeout", EXIT_PEER_LOST: "peer lost",
                EXIT_MISMATCH: "ranks disagree"}


class WirespeedError(RuntimeError):
    """Base of every error wirespeed reports to a user. `exit_code` is what the CLI exits with.
    A RuntimeError, as torch.distributed's own errors are, so code written for those catches ours."""

    exit_code = EXIT_FAILED


class UsageError(WirespeedError):
    """Bad input: an unknown name, a size that does not parse, a combination that cannot run here."""

    exit_code = EXIT_USAGE


class BackendUnavailable(UsageError):
    """The chosen backend cannot run on this machine; the message says why and how to get it."""


class PeerTimeout(WirespeedError):
    """A collective made no progress within the timeout: a peer hangs, is stopped or unreachable,
    or never joined the job."""

    exit_code = EXIT_TIMEOUT


class PeerLost(WirespeedError):
    """A peer process died, or closed its connections, while this rank depended on it."""

    exit_code = EXIT_PEER_LOST


class RanksDisagree(WirespeedError):
    """Ranks called different collectives, or the same one with different sizes, dtypes, ops or
    roots, or run with different settings."""

    exit_code = EXIT_MISMATCH


class RankClaimedTwice(RanksDisagree):
    """Two processes claimed one rank number at the rendezvous (a stale rank of an earlier job on
    the same port, a launcher that started a rank twice): the job cannot know which is its own."""


# ---- the native transport's errors (wirespeed._native raises these: the binding imports them) ----
# Each is the kind of failure it is, so its exit status comes from its type; TransportError says it
# came from the transport (a rank's own error, to be named with its rank when reported).


class TransportError(WirespeedError):
    """Base of every error the native transport raises (wirespeed.native.WirespeedError)."""


class PeerDiedError(TransportError, PeerLost):
    """A peer process died while this rank depended on it."""


class PeerAbortedError(TransportError, PeerLost):
    """A peer failed with an error of its own and aborted the group; the message carries its
    reason, whose kind (a timeout, a mismatch) is the job's (faults.kind_of)."""


class BrokenGroupError(TransportError, PeerLost):
    """The group was broken by an earlier error and must be recreated; the message carries it."""


class CollectiveTimeout(TransportError, PeerTimeout):
    """No progress within the group's timeout."""


class MismatchError(TransportError, RanksDisagree):
    """Ranks called a collective with different sizes, dtypes, ops, roots or kinds."""


class UnsupportedError(TransportError, UsageError):
    """A request this backend cannot serve (the message names what it supports), or a job it
    cannot set up within the ranks' open-file limits (the message names the need, the limit and
    the fix; raised on every rank alike)."""


class StrangerError(TransportError):
    """A peer that does not belong to this job was refused."""
