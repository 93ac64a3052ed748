"""Confinement of a sandbox instance: util-linux ``unshare``, overlayfs, a uid of its own, as root.

An instance is untrusted code driven by an untrusted policy. :func:`confined_argv` wraps its
command so that, before it runs, :mod:`.confining` (run by ``unshare`` as process 1 of new mount,
PID, IPC, UTS and — unless ``network = true`` — network namespaces):

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
6. enters the overlay and its working directory (a ``chroot``), sets its limits (CPU, open files,
   file size, processes) and runs the command as an unprivileged uid of its own: no groups, no
   capabilities in any set, ``no_new_privs`` — what ``unshare --root``, ``prlimit`` and ``setpriv``
   did, in that order.

Why not bubblewrap: Debian's ``bwrap`` (0.8) has no overlay mounts (they came in 0.10), and a
read-only bind of ``/`` breaks every server that writes where it was recorded writing; nsjail is not
packaged in Debian. Util-linux ``unshare`` makes the namespaces; each step after it is one or a few
kernel calls (``mount``, ``mknod``, ``chown``, ``chroot``, ``setrlimit``, ``setresuid``,
``prctl``, ``capset``) made by :mod:`.confining` with the replay's own interpreter in isolated
mode. Those steps were a shell script of util-linux, coreutils and iproute2 programs: 19 ``exec``
calls, 27 to 29 ms of the machine's CPU on every start, against 16 to 17 now (the interpreter's own
start is most of it). It needs root (or CAP_SYS_ADMIN) for mount namespaces, overlayfs and control
groups; :func:`confinement_problem` says in one line what is missing where the kernel refuses one.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
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
_TOOLS = ("unshare", "cp", "find", "chown")  # cp, find and chown: a state snapshot's files
_INSIDE = "import sys; sys.path.append(sys.argv[1]); import confining; confining.main(sys.argv[2:])"
"""What runs inside the namespaces: :mod:`.confining`, imported from its folder (its compiled form kept;
the folder searched last, so no module of it stands for one of the standard library's)."""


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
    """The command line that runs ``command`` confined as ``confinement`` says: ``unshare`` making
    its namespaces, then :mod:`.confining` taking the steps chosen here (the mounts that need no
    directory made first as fstab lines, :func:`_fstab`; the hidden paths from what the instance
    will see) and running it."""
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
    bounds = [limits.cpu_seconds, limits.open_files, limits.stderr_bytes, limits.processes]
    seed = ["" if c.seed is None else c.seed, str(c.seed_uid)]
    inside = [sys.executable, "-I", "-S", "-c", _INSIDE, str(Path(__file__).parent), str(c.root)]
    inside += [str(limits.layer_bytes), str(c.uid)]
    enter = [c.cwd, *map(str, bounds), *(f"{k}={v}" for k, v in c.env), "--"]
    return ["unshare", *namespaces, "--", *inside, *seed, *steps, "--", *enter, *command]


def _fstab(*entries: tuple[str, Path | str, str, str]) -> str:
    """``(source, target, type, options)`` as fstab lines (mounted in order, as ``mount -a`` would)."""
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
        return f"{', '.join(missing)} not found (Debian: apt-get install util-linux coreutils findutils)"
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
