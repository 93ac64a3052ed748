"""The program a confined launch runs inside its new namespaces: the steps, then the server.

:func:`~replay_sim.record.instances.confine.confined_argv` has util-linux ``unshare`` make the
instance's namespaces and, in them, run :func:`main` as root with the replay's interpreter in
isolated mode (``python -I -S``: the standard library only, nothing from the environment or a
``site``; this module imported from its folder, so its compiled form is kept). :func:`main` carries
out the steps :mod:`.confine` chose, in order, each as the kernel calls it takes, then enters the
overlay and runs the server as its unprivileged uid. A shell script of util-linux and coreutils
programs did this before (``mkdir``, ``mount``, ``cp``, ``ip``, ``chown``, ``unshare``,
``prlimit``, ``setpriv``): about twenty ``exec`` calls of a millisecond and more of CPU each, on
every instance's start.

Its arguments::

    ROOT SIZE UID SEED WAS STEP... -- CWD CPU NOFILE FSIZE NPROC NAME=VALUE... -- COMMAND...

``ROOT`` is the instance's workspace (``layer`` and ``merged`` are made in it), ``SIZE`` its
layer's bytes, ``UID`` its uid and gid, ``SEED``/``WAS`` a state snapshot's layer and the uid that
owned it (empty/0: none). The steps (:mod:`.confine` says what each is for): ``cgroup PATH``,
``layer``, ``mounts FSTAB``, ``dev``, ``lo``, ``reveal PATH``, ``bind COPY PATH``, ``own PATH``,
``give PATH``, ``reach PATH``, ``clock PATH``. Then its working directory, its limits (CPU
seconds, open files, file bytes, processes) and the variables added to its environment.

A step that fails ends the launch with status 70 and one line on standard error naming it.
"""

from __future__ import annotations

import _signal
import ctypes
import fcntl
import os
import resource
import struct
import sys
import warnings  # noqa: F401  os.execvpe imports it, once the uid that could read the library is gone

_libc = ctypes.CDLL(None, use_errno=True)

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_FLAGS = {"ro": _MS_RDONLY, "nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "bind": _MS_BIND}
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_DEV = ("null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr")


class StepFailed(Exception):
    """A step could not be carried out (the launch ends)."""


def mount(source: str | None, target: str, kind: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2)."""
    args = [None if value is None else value.encode() for value in (source, target, kind)]
    if _libc.mount(*args, ctypes.c_ulong(flags), None if data is None else data.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def fstab(text: str) -> None:
    """Mount fstab(5) lines in order (``mount -a``): ``nofail`` ones may fail."""
    for line in text.splitlines():
        source, target, kind, options = (_unescaped(field) for field in line.split()[:4])
        words = options.split(",")
        flags = sum(_FLAGS.get(word, 0) for word in words)
        data = ",".join(w for w in words if w not in _FLAGS and w not in ("nofail", "defaults"))
        try:
            mount(source, target, None if kind == "none" else kind, flags, data or None)
        except OSError:
            if "nofail" not in words:
                raise


def _unescaped(field: str) -> str:
    """An fstab field with its octal escapes (``\\040``) read."""
    parts = field.split("\\")
    return parts[0] + "".join(chr(int(part[:3], 8)) + part[3:] for part in parts[1:])


def owned(path: str, uid: int) -> None:
    """``chown -R``, never following a symbolic link (its link is given, not what it names)."""
    os.lchown(path, uid, uid)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), uid, uid)


def run(*argv: str) -> None:
    """Run a program (found on ``PATH``) to its end; a failure is the step's."""
    pid = os.posix_spawnp(argv[0], list(argv), os.environ)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        raise StepFailed(f"{argv[0]} exited with status {code}")


def made(path: str, mode: int | None = None) -> None:
    """``mkdir -p`` (with ``mode`` exactly, whatever the umask)."""
    os.makedirs(path, exist_ok=True)
    if mode is not None:
        os.chmod(path, mode)


def dev(merged: str) -> None:
    """Its ``/dev``: the harmless nodes only, as the host has them (``cp -a``)."""
    for name in _DEV:
        source, target = f"/dev/{name}", f"{merged}/dev/{name}"
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
            continue
        st = os.stat(source)
        os.mknod(target, st.st_mode, st.st_rdev)
        os.chmod(target, st.st_mode & 0o7777)  # whatever the umask
        os.chown(target, st.st_uid, st.st_gid)
    for name in ("shm", "pts"):
        os.mkdir(f"{merged}/dev/{name}")


def loopback_up() -> None:
    """``ip link set lo up`` in its network namespace."""
    import _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)  # not the socket module: it is slow to import
    try:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    finally:
        sock.close()


def steps(root: str, size: str, uid: int, seed: str, was: str, argv: list[str]) -> None:
    """Carry out the steps in ``argv`` (consumed up to and including its ``--``)."""
    layer, merged, reveals = f"{root}/layer", f"{root}/merged", 0
    while (step := argv.pop(0)) != "--":
        if step == "cgroup":
            with open(f"{argv.pop(0)}/cgroup.procs", "w") as procs:
                procs.write(str(os.getpid()))
        elif step == "layer":
            made(layer)
            made(merged)
            mount("replay-sim-layer", layer, "tmpfs", 0, f"size={size},mode=0755")
            if seed:  # a state snapshot's layer: its files, given to this instance's uid
                run("cp", "-a", f"{seed}/.", f"{layer}/")
                run("find", layer, "-xdev", "-uid", was, "-exec", "chown", "-h", f"{uid}:{uid}", "{}", "+")
            for name in ("upper", "work", "run", "reveal"):
                made(f"{layer}/{name}")
            for name in ("tmp", "shm"):
                made(f"{layer}/{name}", 0o1777)
        elif step == "mounts":
            fstab(argv.pop(0))
        elif step == "dev":
            dev(merged)
        elif step == "lo":
            loopback_up()
        elif step == "reveal":
            path = argv.pop(0)
            reveals += 1
            upper = f"{layer}/reveal/{reveals}"
            for where in (f"{upper}/u", f"{upper}/w", merged + path):
                made(where)
            options = f"lowerdir={path},upperdir={upper}/u,workdir={upper}/w"
            mount("replay-sim-reveal", merged + path, "overlay", 0, options)
        elif step == "bind":
            copy, path = argv.pop(0), argv.pop(0)
            owned(copy, uid)
            if os.path.isdir(copy):
                made(merged + path)
            elif not os.path.exists(merged + path):
                made(os.path.dirname(merged + path))
                open(merged + path, "a").close()
            mount(copy, merged + path, None, _MS_BIND)
        elif step == "own":
            path = merged + argv.pop(0)
            made(path)
            os.chown(path, uid, uid)
        elif step == "give":
            owned(merged + argv.pop(0), uid)
        elif step == "reach":
            path = merged + argv.pop(0)
            os.chmod(path, os.stat(path).st_mode | 0o001)
        elif step == "clock":
            path = argv.pop(0)
            made(merged + path)
            mount(path, merged + path, None, _MS_BIND)
            mount(None, merged + path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
        else:
            raise StepFailed(f"unknown step {step}")


def enter(merged: str, uid: int, argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Enter the overlay and its working directory, take its limits, become its unprivileged uid
    with no groups, no capabilities in any set and ``no_new_privs``; its environment and command."""
    cwd, cpu, nofile, fsize, nproc = argv[:5]
    del argv[:5]
    os.chroot(merged)
    os.chdir(cwd)
    for limit, soft, hard in (
        (resource.RLIMIT_CPU, int(cpu), int(cpu) + 1), (resource.RLIMIT_NOFILE, int(nofile), int(nofile)),
        (resource.RLIMIT_FSIZE, int(fsize), int(fsize)), (resource.RLIMIT_NPROC, int(nproc), int(nproc)),
    ):  # fmt: skip
        resource.setrlimit(limit, (soft, hard))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for cap in range(int(last.read()) + 1):  # takes CAP_SETPCAP: before the uid changes
            _prctl(_PR_CAPBSET_DROP, cap)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    os.setresuid(uid, uid, uid)  # clears the permitted and effective sets
    _clear_inheritable()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    env = dict(os.environ)
    while (assignment := argv.pop(0)) != "--":
        name, _, value = assignment.partition("=")
        env[name] = value
    return env, argv


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, *(ctypes.c_ulong(arg) for arg in (value, 0, 0, 0))) != 0:  # the unused args 0
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl {option}: {os.strerror(errno)}")


def _clear_inheritable() -> None:
    """capset(2) with every set empty (only the inheritable one is not empty by then)."""
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = bytes(24)  # two (effective, permitted, inheritable) triples of 32 bits, all clear
    if _libc.capset(header, data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")


def main(argv: list[str]) -> None:
    """Take the steps ``argv`` gives (the module's docstring says how), then run the server."""
    root, size, uid, seed, was = argv[:5]
    rest = argv[5:]
    try:
        steps(root, size, int(uid), seed, was, rest)
        env, command = enter(f"{root}/merged", int(uid), rest)
    except (OSError, StepFailed, ValueError, IndexError) as exc:
        print(f"replay-sim confine: {exc}", file=sys.stderr)
        sys.exit(70)
    for ignored in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores them, and exec would keep that
        _signal.signal(ignored, _signal.SIG_DFL)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"replay-sim confine: {command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
