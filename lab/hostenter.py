"""`python -m eroica.lab.hostenter --hostname H --cgroup CG --tmp DIR --hosts-file F [--keep P ...] -- CMD`:
become a simulated host (eroica.lab.hosts) and exec CMD. Run inside fresh UTS and mount namespaces
(`unshare --uts --mount --propagation private`): it sets the hostname, joins the host's cgroup,
mounts the host's own directory on /tmp (the kept paths under /tmp mounted back, through a staging
tmpfs on /mnt) and its hosts file on /etc/hosts. Nothing here outlives the namespaces."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="eroica-hostenter")
    p.add_argument("--hostname", required=True)
    p.add_argument("--cgroup", required=True)
    p.add_argument("--tmp", required=True)
    p.add_argument("--hosts-file", required=True)
    p.add_argument("--keep", action="append", default=[])
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command after --")
    socket.sethostname(a.hostname)
    Path(a.cgroup, "cgroup.procs").write_text(str(os.getpid()))
    # paths under /tmp that stay visible: the run directory, a checkout or interpreter living there
    keep = {str(Path(k).resolve()) for k in [*a.keep, sys.prefix, sys.base_prefix, *sys.path] if k}
    keep = {k for k in keep if k.startswith("/tmp/") and Path(k).exists()}
    kept = sorted(k for k in keep if not any(k != o and k.startswith(o + "/") for o in keep))
    subprocess.run(["mount", "--bind", a.hosts_file, "/etc/hosts"], check=True)    # before /tmp is covered
    # the machine's /tmp stays reachable at a staging point (a path walk from an old /tmp handle would
    # cross into the new mount), then the host's own directory covers /tmp and the kept paths come back
    stage = next(d for d in ("/mnt", "/media", "/srv", "/opt") if Path(d).is_dir())
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", stage], check=True)
    Path(stage, "tmp").mkdir()
    subprocess.run(["mount", "--bind", "/tmp", f"{stage}/tmp"], check=True)
    subprocess.run(["mount", "--bind", a.tmp, "/tmp"], check=True)
    for k in kept:
        Path(k).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", f"{stage}/tmp/{os.path.relpath(k, '/tmp')}", k], check=True)
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main())
