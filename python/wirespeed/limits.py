"""What this process may hold, checked before a command does any work: a limit too low for any
job is named as such in one line, rather than surfacing later as a library's failure to open a
socket or a pipe (torch's store or gloo printing a C++ stack, or a link probe calling the link
down)."""
from __future__ import annotations

import resource

from .errors import UsageError

# A command's process, rank or launcher, with torch imported and a job's store, pipes and first
# sockets open, uses ~25-30 descriptors (measured: a 2-rank bench runs at `ulimit -n 32` and fails
# at 16); the rest is headroom. The native transport sizes its TCP streams to what is left
# (crates/wirespeed-core/src/hosts/fds.rs).
OPEN_FILES_MIN = 64


def check_open_files(minimum: int = OPEN_FILES_MIN) -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < minimum:
        raise UsageError(f"the open-file limit (ulimit -n) is {soft}; wirespeed needs at least {minimum} "
                         f"open files in every process: raise it (ulimit -n 1024) and run again")
