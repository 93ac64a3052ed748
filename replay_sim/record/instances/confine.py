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
4. covers the paths it must not see with empty tmpfs mounts (the replay's store, index, snapshots,
   config, every instance's workspace) and makes the paths its config names under a private
   directory visible copy-on-write, binds its own ``state``/``mounts`` copies back, and hands it
   its home, working directory and its program's own Python environment's folders (a copy-up
   owned by its uid);
5. brings loopback up in its network namespace, then ``chroot``s into the overlay and runs the
   command through ``prlimit`` (CPU, open files, file size, processes) and ``setpriv`` (an
   unprivileged uid of its own, no groups, no capabilities in any set, ``no_new_privs``).

Why these tools rather than bubblewrap: Debian's ``bwrap`` (0.8) has no overlay mounts (they came in
0.10), and a read-only bind of ``/`` breaks every server that writes where it was recorded writing;
nsjail is not packaged in Debian. ``unshare``, ``mount``, ``setpriv``, ``prlimit`` and ``chroot``
are util-linux/coreutils, present wherever the SDK's process handling already is, and each does one
well-reviewed kernel call; the script only orders them. It needs root (or CAP_SYS_ADMIN) for mount
namespaces, overlayfs and control groups; :func:`confinement_problem` says in one line what is
missing where the kernel refuses one.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from replay_sim.record.containment import Containment
from replay_sim.record.instances.cgroups import cgroup_problem
from replay_sim.record.instances.environment import environment_paths

if TYPE_CHECKING:
    from replay_sim.record.config import UpstreamSpec

__all__ = [
    "UID_BASE",
    "Confinement",
    "Placement",
    "confined_argv",
    "confinement_problem",
    "instance_uids",
    "plan",
    "private",
]

UID_BASE = 1_900_000_000
"""Instances run as ``UID_BASE + n``: a uid no account has, one per instance of a replay."""

_PRIVATE = ("/tmp", "/run", "/dev/shm", "/var/run")  # fresh, empty directories in every instance
_TOOLS = ("unshare", "mount", "chroot", "setpriv", "prlimit", "env", "ip", "chown")

_SCRIPT = r"""
set -eu
root=$1 size=$2 uid=$3 net=$4 seed=$5 was=$6; shift 6
L=$root/layer M=$root/merged n=0
base() {
  mkdir -p "$L" "$M"
  mount -t tmpfs -o "size=$size,mode=0755" replay-sim-layer "$L"
  if [ -n "$seed" ]; then  # a state snapshot's layer: its files, given to this instance's uid
    cp -a "$seed/." "$L/"; find "$L" -xdev -uid "$was" -exec chown -h "$uid:$uid" {} +
  fi
  mkdir -p "$L/upper" "$L/work" "$L/tmp" "$L/run" "$L/shm" "$L/reveal"
  chmod 1777 "$L/tmp" "$L/shm"
  mount -t overlay replay-sim-root -o "lowerdir=/,upperdir=$L/upper,workdir=$L/work" "$M"
  mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys" 2>/dev/null || true
  mount -t tmpfs -o size=1m,mode=0755,nosuid replay-sim-dev "$M/dev"
  # The host's nodes made again (one cp, not a touch and a mount each: 3 ms a start, not 32 ms)
  cp -a /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty "$M/dev/"
  ln -s /proc/self/fd "$M/dev/fd"; ln -s fd/0 "$M/dev/stdin"
  ln -s fd/1 "$M/dev/stdout"; ln -s fd/2 "$M/dev/stderr"
  mkdir "$M/dev/shm" "$M/dev/pts"; mount --bind "$L/shm" "$M/dev/shm"
  mount --bind "$L/tmp" "$M/tmp"; mount --bind "$L/run" "$M/run"
  if [ "$net" = 0 ]; then ip link set lo up; fi
}
while [ "$1" != -- ]; do
  case $1 in
    cgroup) echo $$ > "$2/cgroup.procs"; shift 2 ;;
    base) base; shift ;;
    hide)
      if [ -d "$M$2" ]; then mount -t tmpfs -o size=64k,mode=0755 replay-sim-hidden "$M$2"
      elif [ -e "$M$2" ]; then mount --bind /dev/null "$M$2"; fi
      shift 2 ;;
    reveal)
      n=$((n + 1)); R=$L/reveal/$n; mkdir -p "$R/u" "$R/w" "$M$2"
      mount -t overlay replay-sim-reveal -o "lowerdir=$2,upperdir=$R/u,workdir=$R/w" "$M$2"
      shift 2 ;;
    bind)
      chown -R "$uid:$uid" "$2"
      if [ -d "$2" ]; then mkdir -p "$M$3"; else mkdir -p "$(dirname "$M$3")"; touch "$M$3"; fi
      mount --bind "$2" "$M$3"; shift 3 ;;
    own) mkdir -p "$M$2"; chown "$uid:$uid" "$M$2"; shift 2 ;;
    give) chown -R "$uid:$uid" "$M$2"; shift 2 ;;
    reach) chmod o+x "$M$2"; shift 2 ;;
    clock)
      mkdir -p "$M$2"; mount --bind "$2" "$M$2"; mount -o remount,bind,ro "$M$2"; shift 2 ;;
    *) echo "replay-sim confine: unknown step $1" >&2; exit 70 ;;
  esac
done
shift
cd "$M"
exec chroot "$M" "$@"
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
    """The command line that runs ``command`` confined as ``confinement`` says."""
    c, limits = confinement, confinement.containment.limits
    namespaces = ["--mount", "--propagation", "private", "--pid", "--fork", "--kill-child=SIGKILL"]
    namespaces += ["--ipc", "--uts"] + ([] if c.containment.network else ["--net"])
    steps: list[str] = []
    for group in c.cgroups:
        steps += ["cgroup", str(group)]
    steps.append("base")
    for path in c.reveal:  # none lies under a hidden path; hidden paths may lie under one
        steps += ["reveal", path]
    for path in c.hidden:
        steps += ["hide", path]
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
    env = ["env", "-C", c.cwd, *(f"{k}={v}" for k, v in c.env)]
    size = str(limits.layer_bytes)
    net = "1" if c.containment.network else "0"
    seed = ["" if c.seed is None else c.seed, str(c.seed_uid)]
    script = ["sh", "-c", _SCRIPT, "replay-sim-confine", str(c.root), size, str(c.uid), net, *seed]
    return [
        "unshare", *namespaces, "--", *script, *steps, "--", *prlimit, *setpriv, *env, *command,
    ]  # fmt: skip


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


def plan(
    root: Path, spec: UpstreamSpec, placement: Placement, named: list[str], cwd: str | None,
    binds: list[tuple[str, str]],
) -> Confinement:  # fmt: skip
    """What a confined launch hides, reveals, binds and hands over, for the paths its config names.

    Args:
        root: The instance's workspace (its parent, where every instance's workspace is, is hidden).
        spec: The server's spec.
        placement: Its uid, the paths it must not see and those its recordings name.
        named: Its command, args and env values (absolute paths among them, or after an ``=`` in
            one, under a private directory such as ``/tmp`` are revealed copy-on-write and given).
        cwd: Its working directory (None: the replay's), revealed and handed to it.
        binds: ``(copy, path)`` of its own copies.
    """
    named = [_named_path(value) for value in named]
    workdir = os.path.abspath(cwd) if cwd else os.getcwd()
    hidden = list(dict.fromkeys(os.path.abspath(p) for p in (*placement.hidden, str(root.parent))))
    hidden = [p for p in hidden if p not in _PRIVATE and p != "/"]  # those are fresh already

    def under(path: str, tops: list[str]) -> bool:
        return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)

    reveal: list[str] = []
    # A path not there yet (a state file the server makes on its first write): its folder.
    recorded = [p if os.path.exists(p) else os.path.dirname(p) for p in placement.recorded]
    absent = [os.path.dirname(p) for p in named if os.path.isabs(p) and not os.path.exists(p)]
    for value in [*named, *absent, workdir, *recorded]:
        path = os.path.normpath(value) if os.path.isabs(value) else ""
        if not path or not private(path) or under(path, [*hidden, str(root)]) or not os.path.exists(path):
            continue
        path = path if os.path.isdir(path) else os.path.dirname(path)
        if not private(path) or path in _PRIVATE:
            continue
        if not under(path, reveal):
            reveal = [r for r in reveal if not under(r, [path])] + [path]
    home = os.environ.get("HOME", "/root") if "HOME" not in spec.env else spec.env["HOME"]
    folders, files = environment_paths(named)  # its own Python environment's
    owned = [p for p in dict.fromkeys([home, workdir, *folders]) if p != "/" and not under(p, hidden)]
    bound = [path for _, path in binds]
    # A directory revealed under /tmp holds the state the server was started with or recorded using
    # (its state file's folder, a repository its calls name): it wrote there when recorded, so it may here.
    given = [p for p in [*_given([*named, *reveal]), *files] if not under(p, [*hidden, *bound, str(root)])]
    reach = [d for d in _closed_ancestors([*named, workdir]) if not under(d, hidden)]
    return Confinement(
        root, placement.uid, spec.containment, hidden=tuple(hidden), reveal=tuple(reveal),
        binds=tuple(binds), owned=tuple(owned), given=tuple(given), reach=tuple(reach), cwd=workdir,
    )  # fmt: skip


def _named_path(value: str) -> str:
    """The path an argument names: itself, or the absolute path after its first ``=`` (an option
    ``--db-path=/srv/shop.db``, or a variable ``MEMORY_FILE_PATH=/tmp/m.jsonl`` for ``env(1)``)."""
    _, equals, tail = value.partition("=")
    return tail if equals and not os.path.isabs(value) and os.path.isabs(tail) else value


_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/sys", "/dev", "/boot",
           "/opt", "/var/lib", "/snap", "/root/.pyenv")  # fmt: skip
_GIVEN_ENTRIES = 20_000  # a named directory holding more is not copied up (it stays the host's, read-only)


def _given(named: list[str]) -> list[str]:
    """The directories a command line names that its instance is given as its own (copied up whole):
    existing, absolute, outside the system's directories, and of at most ``_GIVEN_ENTRIES`` entries."""
    found: list[str] = []
    for value in named:
        path = os.path.normpath(value) if os.path.isabs(value) else ""
        if not path or path == "/" or not os.path.isdir(path) or path in found:
            continue
        if any(path == s or path.startswith(s + "/") for s in _SYSTEM) or path.count("/") < 2:
            continue  # a system directory, or a top-level one (/srv, /home): not the server's own data
        entries = 0
        for _, dirs, files in os.walk(path):
            entries += len(dirs) + len(files)
            if entries > _GIVEN_ENTRIES:
                break
        if entries <= _GIVEN_ENTRIES:
            found.append(path)
    return found


def _closed_ancestors(named: list[str]) -> list[str]:
    """Directories others may not enter on the way to the programs and paths named (and interpreters)."""
    paths = []
    for value in named:
        found = shutil.which(value) if not os.path.isabs(value) and os.sep not in value else value
        if found and os.path.isabs(found) and os.path.exists(found):
            paths += [found, os.path.realpath(found), *_interpreter(os.path.realpath(found))]
    closed: dict[str, None] = {}
    for path in paths:
        for parent in Path(path).parents:
            with suppress(OSError):
                if parent != Path("/") and not parent.stat().st_mode & stat.S_IXOTH:
                    closed[str(parent)] = None
    return list(closed)


def _interpreter(program: str) -> list[str]:
    """A script's interpreter from its ``#!`` line (its real path too), or nothing."""
    try:
        with open(program, "rb") as f:
            line = f.readline(256)
    except OSError:
        return []
    words = line[2:].split() if line.startswith(b"#!") else []
    if not words:
        return []
    interpreter = os.fsdecode(words[0])
    return [interpreter, os.path.realpath(interpreter)] if os.path.isabs(interpreter) else []


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
    return any(path == d or path.startswith(d + os.sep) for d in _PRIVATE)
