"""Confinement of a sandbox instance: util-linux ``unshare`` + overlayfs + ``setpriv``, as root.

An instance is untrusted code driven by an untrusted policy. :func:`confined_argv` wraps its
command so that, before it runs, a short ``sh`` script (run by ``unshare`` as process 1 of new
mount, PID, IPC, UTS and — unless ``network = true`` — network namespaces):

1. joins the instance's control groups (:mod:`.cgroups`: memory and process limits);
2. mounts a size-limited tmpfs (the *layer*, ``layer_mb``) in the instance's workspace, and an
   overlayfs over ``/`` whose upper directory lives on it: the host's filesystem read-only under a
   private copy-on-write layer, so state a server keeps at fixed paths is its own, nothing it
   writes reaches the host, and the layer ends with the mount namespace;
3. gives it a private ``/proc`` (its own PID namespace: the replay and the host's process table are
   not there), ``/dev`` (the harmless nodes only), ``/tmp``, ``/dev/shm`` and ``/run`` (on the layer);
4. brings loopback up in its network namespace;
5. makes the paths its config names under a private directory visible copy-on-write, covers the
   paths it must not see with empty tmpfs mounts (the replay's store, index, snapshots, config,
   every instance's workspace), binds its own ``state``/``mounts`` copies back, and hands it its
   home, working directory and its program's own Python environment's folders (a copy-up owned by
   its uid) — what :mod:`.planning` chose;
6. enters the overlay and its working directory (``unshare --root --wd``, a ``chroot``) and runs
   the command through ``prlimit`` (CPU, open files, file size, processes) and ``setpriv`` (an
   unprivileged uid of its own, no groups, no capabilities in any set, ``no_new_privs``).

Why these tools rather than bubblewrap: Debian's ``bwrap`` (0.8) has no overlay mounts (they came in
0.10), and a read-only bind of ``/`` breaks every server that writes where it was recorded writing;
nsjail is not packaged in Debian. ``unshare``, ``mount``, ``setpriv`` and ``prlimit``
are util-linux/coreutils, present wherever the SDK's process handling already is, and each does one
well-reviewed kernel call; the script only orders them. It needs root (or CAP_SYS_ADMIN) for mount
namespaces, overlayfs and control groups; :func:`confinement_problem` says in one line what is
missing where the kernel refuses one.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from replay_sim.record.containment import Containment
from replay_sim.record.instances.cgroups import cgroup_problem

__all__ = [
    "PRIVATE",
    "UID_BASE",
    "Confinement",
    "Placement",
    "confined_argv",
    "confinement_problem",
    "instance_uids",
    "private",
]

UID_BASE = 1_900_000_000
"""Instances run as ``UID_BASE + n``: a uid no account has, one per instance of a replay."""

PRIVATE = ("/tmp", "/run", "/dev/shm", "/var/run")  # fresh, empty directories in every instance
_TOOLS = ("unshare", "mount", "setpriv", "prlimit", "env", "ip", "chown")

_SCRIPT = r"""
set -eu
root=$1 size=$2 uid=$3 seed=$4 was=$5; shift 5
L=$root/layer M=$root/merged n=0
while [ "$1" != -- ]; do
  case $1 in
    cgroup) echo $$ > "$2/cgroup.procs"; shift 2 ;;
    layer)
      mkdir -p "$L" "$M"
      mount -t tmpfs -o "size=$size,mode=0755" replay-sim-layer "$L"
      if [ -n "$seed" ]; then  # a state snapshot's layer: its files, given to this instance's uid
        cp -a "$seed/." "$L/"; find "$L" -xdev -uid "$was" -exec chown -h "$uid:$uid" {} +
      fi
      mkdir -p "$L/upper" "$L/work" "$L/run" "$L/reveal"; mkdir -p -m 1777 "$L/tmp" "$L/shm"
      shift ;;
    mounts) printf '%s\n' "$2" > "$L/fstab"; mount -a -T "$L/fstab"; shift 2 ;;
    dev)
      cp -a /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty /dev/fd /dev/stdin \
        /dev/stdout /dev/stderr "$M/dev/"
      mkdir "$M/dev/shm" "$M/dev/pts"; shift ;;
    lo) ip link set lo up; shift ;;
    reveal)
      n=$((n + 1)); R=$L/reveal/$n; mkdir -p "$R/u" "$R/w" "$M$2"
      mount -t overlay replay-sim-reveal -o "lowerdir=$2,upperdir=$R/u,workdir=$R/w" "$M$2"
      shift 2 ;;
    bind)
      chown -R "$uid:$uid" "$2"
      if [ -d "$2" ]; then [ -d "$M$3" ] || mkdir -p "$M$3"
      elif [ ! -e "$M$3" ]; then mkdir -p "$(dirname "$M$3")"; touch "$M$3"; fi
      mount --bind "$2" "$M$3"; shift 3 ;;
    own) [ -d "$M$2" ] || mkdir -p "$M$2"; chown "$uid:$uid" "$M$2"; shift 2 ;;
    give) chown -R "$uid:$uid" "$M$2"; shift 2 ;;
    reach) chmod o+x "$M$2"; shift 2 ;;
    clock)
      [ -d "$M$2" ] || mkdir -p "$M$2"; mount --bind "$2" "$M$2"; mount -o remount,bind,ro "$M$2"; shift 2 ;;
    *) echo "replay-sim confine: unknown step $1" >&2; exit 70 ;;
  esac
done
shift
exec "$@"
"""


@dataclass(frozen=True)
class Placement:
    """What the pool tells one instance's launch.

    Attributes:
        uid: The unprivileged uid it runs as when confined (one per live instance).
        hidden: Paths it must not see when confined (the replay's store, index, snapshots, config).
        clock_start: What its clock reads at launch (``clock = "recorded"``); None: the host's clock.
        recorded: Paths under a private directory that its server's recorded calls name (a
            repository, a file to edit): revealed copy-on-write and handed to it like its own.
        seed: A state snapshot it starts from (:mod:`.snapshots`: ``layer``, ``state``, ``mounts``
            copies of another instance's), or None: the initial state.
        seed_uid: The uid of the instance the snapshot was taken from.
    """

    uid: int = UID_BASE
    hidden: tuple[str, ...] = ()
    clock_start: datetime | None = None
    recorded: tuple[str, ...] = ()
    seed: Path | None = None
    seed_uid: int = 0


@dataclass(frozen=True)
class Confinement:
    """What one instance's confined launch is given.

    Attributes:
        root: Its workspace (the layer and the overlay's mount point are made in it).
        uid: The unprivileged uid (and gid) it runs as.
        containment: Its config's network, clock and limits.
        cgroups: Its control groups (:func:`~replay_sim.record.instances.cgroups.make_cgroups`).
        hidden: Paths it must not see (covered by empty tmpfs mounts; a file by ``/dev/null``).
        reveal: Directories under a private or hidden one that it sees copy-on-write all the same.
        binds: ``(copy, path)``: its own copies bound at the paths it knows them by.
        owned: Directories it is given (copied up, owned by its uid, not their files): its home and
            working directory, and its program's own Python environment's (:mod:`.environment`).
        given: Directories its command line names (a repository to serve) or that it is revealed,
            copied up whole and owned by its uid, so a server that writes its state there works
            without ``state`` or ``mounts``; and the files of its Python environment's skeleton.
        reach: Directories on the way to its program that others may not enter (``/root`` holding a
            pyenv): copied up with ``o+x``, so its uid can reach the program.
        cwd: Its working directory.
        env: Variables added at the last step (the pinned clock's).
        clock: The directory of its clock's timestamp file, bound read-only at the same path.
        seed: A state snapshot's layer its own layer starts as a copy of (:mod:`.snapshots`), or None.
        seed_uid: The uid that owned the snapshot's files (they are given to ``uid``).
    """

    root: Path
    uid: int
    containment: Containment
    cgroups: tuple[Path, ...] = ()
    hidden: tuple[str, ...] = ()
    reveal: tuple[str, ...] = ()
    binds: tuple[tuple[str, str], ...] = ()
    owned: tuple[str, ...] = ()
    given: tuple[str, ...] = ()
    reach: tuple[str, ...] = ()
    cwd: str = "/"
    env: tuple[tuple[str, str], ...] = ()
    clock: str | None = None
    seed: str | None = None
    seed_uid: int = 0


def instance_uids() -> Iterator[int]:
    """Uids for one replay's instances: its own block of 65,536 from :data:`UID_BASE`, in turn.

    Instances live briefly and few at once, so a uid comes round again only after 65,536 more
    instances; each live instance has its own, so ``RLIMIT_NPROC`` counts its processes alone.
    """
    block = UID_BASE + (os.getpid() % 4096) * 65536
    return (block + n % 65536 for n in itertools.count(1))


def confined_argv(command: list[str], confinement: Confinement) -> list[str]:
    """The command line that runs ``command`` confined as ``confinement`` says.

    Each step of the script is as few programs as it can be: an instance's start is CPU the episodes
    wait for, and each program the script runs costs about a millisecond. The mounts that need no
    directory made first go to one ``mount -a`` each (:func:`_fstab`), and the hidden paths are
    chosen here, from what the instance will see.
    """
    c, limits = confinement, confinement.containment.limits
    layer, merged = c.root / "layer", c.root / "merged"
    namespaces = ["--mount", "--propagation", "private", "--pid", "--fork", "--kill-child=SIGKILL"]
    namespaces += ["--ipc", "--uts"] + ([] if c.containment.network else ["--net"])
    steps: list[str] = []
    for group in c.cgroups:
        steps += ["cgroup", str(group)]
    steps += ["layer", "mounts", _fstab(
        ("replay-sim-root", merged, "overlay", f"lowerdir=/,upperdir={layer}/upper,workdir={layer}/work"),
        ("proc", merged / "proc", "proc", "nosuid,nodev,noexec"),
        ("sysfs", merged / "sys", "sysfs", "ro,nosuid,nodev,noexec,nofail"),
        ("replay-sim-dev", merged / "dev", "tmpfs", "size=1m,mode=0755,nosuid"),
    ), "dev", "mounts", _fstab(*(
        (str(layer / inside), merged / target.lstrip("/"), "none", "bind")
        for inside, target in (("shm", "/dev/shm"), ("tmp", "/tmp"), ("run", "/run"))
    ))]  # fmt: skip
    if not c.containment.network:
        steps.append("lo")
    for path in c.reveal:  # none lies under a hidden path; hidden paths may lie under one
        steps += ["reveal", path]
    hides = [h for path in c.hidden if _seen(path, c.reveal) and (h := _hide(path, merged)) is not None]
    if hides:
        steps += ["mounts", _fstab(*hides)]
    for copy, path in c.binds:
        steps += ["bind", copy, path]
    for path in c.reach:
        steps += ["reach", path]
    for path in c.owned:
        steps += ["own", path]
    for path in c.given:
        steps += ["give", path]
    if c.clock is not None:  # after the hidden paths: it lies in its (hidden) workspace
        steps += ["clock", c.clock]
    prlimit = [
        "prlimit", f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--nofile={limits.open_files}:{limits.open_files}",
        f"--fsize={limits.stderr_bytes}:{limits.stderr_bytes}",
        f"--nproc={limits.processes}:{limits.processes}", "--",
    ]  # fmt: skip
    setpriv = [
        "setpriv", f"--reuid={c.uid}", f"--regid={c.uid}", "--clear-groups", "--inh-caps=-all",
        "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
    ]  # fmt: skip
    env = ["env", *(f"{k}={v}" for k, v in c.env)] if c.env else []
    size = str(limits.layer_bytes)
    seed = ["" if c.seed is None else c.seed, str(c.seed_uid)]
    script = ["sh", "-c", _SCRIPT, "replay-sim-confine", str(c.root), size, str(c.uid), *seed]
    into = ["unshare", f"--root={merged}", f"--wd={c.cwd}", "--"]  # chroot, then its working directory
    return [
        "unshare", *namespaces, "--", *script, *steps, "--", *into, *prlimit, *setpriv, *env, *command,
    ]  # fmt: skip


def _fstab(*entries: tuple[str, Path | str, str, str]) -> str:
    """``(source, target, type, options)`` as fstab lines (``mount -a`` mounts them in order)."""
    return "\n".join(" ".join(_fstab_field(str(field)) for field in entry) + " 0 0" for entry in entries)


def _fstab_field(value: str) -> str:
    """A field of an fstab line: whitespace and backslashes as fstab(5)'s octal escapes."""
    return "".join(f"\\{ord(ch):03o}" if ch in " \t\n\\" else ch for ch in value)


def _seen(path: str, reveal: tuple[str, ...]) -> bool:
    """Whether an instance would see ``path``: outside its fresh private directories, or revealed."""
    return not private(path) or any(path == r or path.startswith(r.rstrip("/") + "/") for r in reveal)


def _hide(path: str, merged: Path) -> tuple[str, Path, str, str] | None:
    """The mount that covers a path an instance must not see: an empty tmpfs over a directory,
    ``/dev/null`` over a file; None when there is nothing there to cover."""
    target = merged / path.lstrip("/")
    if os.path.isdir(path):
        return ("replay-sim-hidden", target, "tmpfs", "size=64k,mode=0755")
    if os.path.exists(path):
        return ("/dev/null", target, "none", "bind")
    return None


def confinement_problem() -> str | None:
    """Why instances cannot be confined here (one line naming what is missing and how to allow it).

    Probes each mechanism with a short run: the tools, the namespaces, a confined ``true`` (overlay,
    tmpfs, chroot, setpriv), and control groups. None when every one works.
    """
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: apt-get install util-linux mount iproute2 coreutils)"
    namespaces = ["unshare", "--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "true"]
    if failure := _failure(namespaces):
        return (
            f"cannot make mount, PID and network namespaces ({failure}): run as root, or a container "
            "with CAP_SYS_ADMIN (docker run --privileged, or --cap-add SYS_ADMIN with seccomp unconfined)"
        )
    if problem := cgroup_problem():
        return f"{problem} (mount cgroupfs read-write, e.g. docker run --privileged or --cgroupns=host)"
    with tempfile.TemporaryDirectory(prefix="replay-sim-probe-") as root:
        probe = Confinement(Path(root), UID_BASE, Containment(), owned=("/probe-home",))
        if failure := _failure(confined_argv(["true"], probe)):
            return (
                f"a confined run fails ({failure}): overlayfs and tmpfs mounts in a mount namespace "
                "are needed (a kernel with overlayfs, run as root)"
            )
    return None


def _failure(argv: list[str]) -> str | None:
    """The last line of a failed run's stderr (or its exit status), None when it succeeds."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def private(path: str) -> bool:
    """Whether ``path`` lies under a directory an instance gets a fresh copy of (``/tmp``, ``/run``...)."""
    return any(path == d or path.startswith(d + os.sep) for d in PRIVATE)
