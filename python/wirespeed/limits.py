"""What this process may hold, checked before a command does any work: a limit too low for any
job is named as such in one line, rather than surfacing later as a library's failure to open a
socket or a pipe (torch's store or gloo printing a C++ stack, or a link probe calling the link
down)."""
from __future__ import annotations

import resource

from .errors import UsageError

# A command's process, rank or launcher, with torch imported and a job's store, pipes and first
# sockets open: a 2-rank bench runs at `ulimit -n 32` and fails at 16 (gloo: "pipe: Too many open
# files", then torch's stack from the other rank). Above this, what TCP streams a limit holds is
# the native transport's to say (crates/wirespeed-core/src/hosts/fds.rs), by name and per rank.
OPEN_FILES_MIN = 32


def check_open_files(minimum: int = OPEN_FILES_MIN) -> None:
    """A soft limit below `minimum` is raised where the hard limit allows (as the transport raises
    its own); a hard limit below it is refused in one line."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= minimum:
        return
    if hard == resource.RLIM_INFINITY or hard >= minimum:
        resource.setrlimit(resource.RLIMIT_NOFILE, (minimum, hard))
        return
    raise UsageError(f"the open-file limit (ulimit -n) is {hard}; wirespeed needs at least {minimum} "
                     f"open files in every process: raise it (ulimit -n 1024) and run again")
