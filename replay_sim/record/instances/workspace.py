"""Where a sandbox instance runs: its own copy of its state or mounted paths, and a launch that dies with us.

:func:`prepare` makes an instance's :class:`Workspace` — a private directory holding its copy of the
server's pristine ``state`` directory (isolation ``state``; ``{state}`` in command, args, env values
and cwd names the copy) or of each path in ``mounts`` (isolation ``mount``) — and the command line
that launches it through a :class:`Launcher`:

- ``setpriv --pdeathsig KILL`` (util-linux), so the process is killed when the replay dies, even by
  SIGKILL: the kernel's parent-death signal;
- where the kernel lets us (root, or CAP_SYS_ADMIN), ``unshare --pid --fork --kill-child``: the
  server runs as process 1 of its own PID namespace, whose end takes every process the server
  started with it — no grandchild outlives the instance;
- for ``mount`` isolation, ``unshare --mount --propagation private`` too, and a shell step that
  bind-mounts each copy over its path before it runs the server, so each instance sees its own copy
  at the same absolute path and no other process sees it at all.

The process is a process group of its own (the SDK's spawn), which :meth:`Instance.close` ends whole.

Unless the pool was told to run them unconfined (``--unconfined-sandboxes``), every instance is also
*confined* (:mod:`.confine`): its own copy-on-write view of the host, no network, no privileges,
limits. Then ``state`` and ``mounts`` copies are bound inside that view, and :meth:`Launcher.require`
refuses to start sandboxes at all where the kernel does not allow confinement.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from replay_sim.errors import SandboxUnavailable, UpstreamError
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.containment import Clock
from replay_sim.record.instances.cgroups import make_cgroups, remove_cgroups, stale_cgroups
from replay_sim.record.instances.clock import ClockFile, clock_env, faketime_library
from replay_sim.record.instances.confine import Placement, confined_argv, confinement_problem
from replay_sim.record.instances.planning import plan
from replay_sim.record.instances.procfs import started_at
from replay_sim.record.isolation import STATE_PLACEHOLDER, Isolation

__all__ = ["Launcher", "Workspace", "claim", "prepare", "sweep"]

_OWNER = ".replay-sim-owner"  # in an instance directory: the replay that made it
# Bind-mounts "$2"→"$3", "$4"→"$5", … (each copy over its path) until "--", enters "$1" (the cwd,
# looked up again so it is the copy when it lies under a mounted path), then becomes the server.
_MOUNT_SCRIPT = (
    'cwd=$1; shift; while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 125; shift 2; done; shift; '
    'if [ -n "$cwd" ]; then cd "$cwd" || exit 125; fi; exec "$@"'
)


@dataclass(frozen=True)
class Launcher:
    """The wrappers an instance's command is run through, as found on this machine.

    Attributes:
        setpriv: ``setpriv`` (sets the parent-death signal), or None where it is missing.
        unshare: ``unshare``, or None where it is missing.
        namespaces: Whether ``unshare`` may make PID and mount namespaces here (root or CAP_SYS_ADMIN).
        confinement_problem: Why instances cannot be confined here (one line), None when they can.
        unconfined: The explicit opt-out: instances run unconfined (``--unconfined-sandboxes``).
    """

    setpriv: str | None
    unshare: str | None
    namespaces: bool
    confinement_problem: str | None = "not probed (Launcher.detect() probes it)"
    unconfined: bool = False

    @classmethod
    @functools.cache
    def detect(cls) -> Launcher:
        """What this machine offers (probed once per process: a short run of each wrapper)."""
        setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
        if setpriv is not None and not _runs([setpriv, "--pdeathsig", "KILL", "--", "true"]):
            setpriv = None  # too old for --pdeathsig (util-linux < 2.33)
        namespaces = unshare is not None and _runs(
            [unshare, "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "true"]
        )
        return cls(setpriv, unshare, namespaces, confinement_problem())

    @property
    def confined(self) -> bool:
        """Whether instances are launched confined (:mod:`.confine`)."""
        return not self.unconfined and self.confinement_problem is None

    def opted_out(self, unconfined: bool) -> Launcher:
        """This launcher with the explicit opt-out set (or not)."""
        return dataclasses.replace(self, unconfined=unconfined)

    def require(self, clocks: bool = False) -> None:
        """Refuse to run sandboxes that cannot be confined (or pinned to a clock) as asked.

        Args:
            clocks: Whether a served sandbox keeps ``clock = "recorded"`` (needs libfaketime).

        Raises:
            SandboxUnavailable: One line naming what is missing and how to allow it.
        """
        if not self.unconfined and self.confinement_problem is not None:
            raise SandboxUnavailable(
                f"sandbox instances cannot be contained here: {self.confinement_problem}; or pass "
                "--unconfined-sandboxes to run them unconfined (as root, on the host's files and network)"
            )
        if clocks and faketime_library() is None:
            raise SandboxUnavailable(
                "sandbox instances cannot run on their recordings' clock: libfaketime is not installed "
                '(apt-get install libfaketime), or set clock = "real" in their [servers.NAME] tables'
            )

    @property
    def parent_death(self) -> bool:
        """Whether an instance dies with the replay process even when that is killed outright."""
        return self.setpriv is not None

    def argv(self, command: list[str], *, cwd: str | None, binds: list[tuple[str, str]]) -> list[str]:
        """The command line that runs ``command`` as an instance (``binds``: copy → path, mount only).

        Raises:
            UpstreamError: ``binds`` are asked for where mount namespaces cannot be made.
        """
        if binds and not self.namespaces:
            raise UpstreamError(
                "isolation 'mount' needs private mount namespaces (`unshare --mount`, util-linux, run as "
                "root or with CAP_SYS_ADMIN), which this machine does not allow; use 'state' or 'exclusive'"
            )
        argv = list(command)
        if binds:
            pairs = [part for pair in binds for part in pair]
            argv = ["sh", "-c", _MOUNT_SCRIPT, "replay-sim-mount", cwd or "", *pairs, "--", *argv]
        if self.namespaces:
            assert self.unshare is not None
            mount = ["--mount", "--propagation", "private"] if binds else []
            argv = [self.unshare, "--pid", "--fork", "--kill-child=SIGKILL", *mount, "--", *argv]
        if self.setpriv is not None:
            argv = [self.setpriv, "--pdeathsig", "KILL", "--", *argv]
        return argv


def _runs(argv: list[str]) -> bool:
    """Whether a command runs and succeeds here (within a few seconds)."""
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass(frozen=True)
class _Launched(UpstreamSpec):
    """The spec an instance's upstream is started from: the wrapped command, described as configured."""

    shown: str = ""

    def describe(self) -> str:
        return self.shown or super().describe()


@dataclass
class Workspace:
    """One instance's private directory and how to launch it there.

    Attributes:
        root: The directory holding the instance's copies (deleted by :meth:`remove`).
        spec: The upstream to start: the server's command, wrapped and with ``{state}`` replaced.
        confined: Whether it is launched confined.
        cgroups: Its control groups (removed by :meth:`remove`).
        clock: Its pinned clock's timestamp file (``clock = "recorded"``), or None: the host's clock.
    """

    root: Path
    spec: UpstreamSpec
    confined: bool = False
    cgroups: list[Path] = field(default_factory=list)
    clock: ClockFile | None = None

    def remove(self) -> None:
        """Delete the instance's copies (its state) and its control groups (once its processes ended)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.cgroups = remove_cgroups(self.cgroups)  # a busy one is left to sweep()


def prepare(
    server: str,
    instance_id: str,
    spec: UpstreamSpec,
    launcher: Launcher,
    base: Path | None,
    placement: Placement | None = None,
) -> Workspace:
    """Make instance ``instance_id``'s workspace: copies of its state, and its launch (blocking: file copies).

    Args:
        server: The recorded server name (for messages).
        instance_id: The instance's id (names its directory).
        spec: The server's spec from the recorder config (a sandbox with a command, or a URL).
        launcher: How instances are launched here.
        base: Where instance directories are made (None: the system's temporary directory).
        placement: Its uid, the paths it must not see and its clock (default: :class:`Placement`).

    Raises:
        UpstreamError: A pristine ``state`` directory or a mounted path is missing or cannot be
            copied, its control groups cannot be made, or mount isolation is not possible here
            (names the server and the path).
    """
    try:
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"replay-sim-{instance_id}-", dir=base))
    except OSError as exc:
        where = base or tempfile.gettempdir()
        raise UpstreamError(
            f"sandbox {server!r}: cannot make an instance directory in {str(where)!r}: {exc.strerror or exc}"
        ) from None
    try:
        claim(root)
        return _prepare(server, root, spec, launcher, placement or Placement())
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def sweep(base: Path | None) -> int:
    """Delete the instance directories in ``base`` (and control groups) whose replay is gone.

    A directory names its owner (pid and start time); one whose owner no longer runs is deleted,
    one without an owner or of a live replay is left. Returns how many were deleted.
    """
    swept = 0
    for root in Path(base or tempfile.gettempdir()).glob("replay-sim-*"):
        try:
            pid, _, started = (root / _OWNER).read_text().partition(" ")
        except OSError:
            continue  # not an instance directory, or not ours to read
        if pid.isdigit() and _owner(int(pid)) != f"{pid} {started}":
            shutil.rmtree(root, ignore_errors=True)
            swept += 1
    return swept + stale_cgroups()


def claim(root: Path) -> None:
    """Mark ``root`` (in a pool's base directory) as this replay's: :func:`sweep` deletes it when the
    replay is gone."""
    (root / _OWNER).write_text(_owner(os.getpid()))


def _owner(pid: int) -> str:
    """``pid start-time``: names one process, not a later one given the same pid."""
    return f"{pid} {started_at(pid)}"


def _prepare(
    server: str, root: Path, spec: UpstreamSpec, launcher: Launcher, placement: Placement
) -> Workspace:
    if spec.command is None:  # a URL, isolation "exclusive": nothing of its own to copy or wrap
        return Workspace(root, spec)
    command, args, env, cwd = spec.command, list(spec.args), dict(spec.env), spec.cwd
    seed = placement.seed  # a state snapshot's copies (taken as this workspace lays them out), or None
    if spec.isolation is Isolation.STATE and spec.state is not None:
        state = root / "state"
        _copy(server, "state", seed / "state" if seed else Path(spec.state), state)
        command, args, env, cwd = _substitute(str(state), command, args, env, cwd)
    binds: list[tuple[str, str]] = []
    if spec.isolation is Isolation.MOUNT:
        for number, path in enumerate(spec.mounts):
            copy = root / "mounts" / str(number) / (Path(path).name or "root")
            _copy(server, "mounts", seed / copy.relative_to(root) if seed else Path(path), copy)
            binds.append((str(copy), os.path.normpath(path)))
    clock: dict[str, str] = {}
    clock_file: ClockFile | None = None
    if spec.containment.clock is Clock.RECORDED and placement.clock_start is not None:
        try:
            (root / "clock").mkdir(mode=0o755)
            clock_file = ClockFile(root / "clock" / "faketime", placement.clock_start)
            clock = clock_env(clock_file.path)
        except FileNotFoundError as exc:
            raise UpstreamError(f'sandbox {server!r}: {exc}, or set clock = "real"') from None
    cgroups: list[Path] = []
    try:
        if launcher.confined:
            cgroups = _cgroups(root, spec)
            if (root / "state").exists():  # its copy, seen where {state} says
                binds.insert(0, (str(root / "state"), str(root / "state")))
            named = [command, *args, *env.values()]
            confinement = plan(root, spec, placement, named, cwd, binds)
            confinement = dataclasses.replace(
                confinement, cgroups=tuple(cgroups), env=tuple(clock.items()),
                clock=None if clock_file is None else str(clock_file.path.parent),
                seed=None if seed is None else str(seed / "layer"), seed_uid=placement.seed_uid,
            )  # fmt: skip
            argv = confined_argv([command, *args], confinement)
            argv = [launcher.setpriv, "--pdeathsig", "KILL", "--", *argv] if launcher.setpriv else argv
        else:
            env |= clock
            argv = launcher.argv([command, *args], cwd=cwd and os.path.abspath(cwd), binds=binds)
    except UpstreamError as exc:
        remove_cgroups(cgroups)
        raise UpstreamError(f"sandbox {server!r}: {exc}") from None
    launched = _Launched(
        command=argv[0], args=tuple(argv[1:]), env=env, cwd=cwd, timeout=spec.timeout,
        startup_timeout=spec.startup_timeout, containment=spec.containment, shown=spec.describe(),
    )  # fmt: skip
    return Workspace(root, launched, launcher.confined, cgroups, clock_file)


def _cgroups(root: Path, spec: UpstreamSpec) -> list[Path]:
    limits = spec.containment.limits
    try:
        return make_cgroups(
            f"{os.getpid()}-{root.name}", memory_bytes=limits.memory_bytes, processes=limits.processes
        )
    except OSError as exc:
        raise UpstreamError(f"cannot make its control groups: {exc.strerror or exc}") from None


def _copy(server: str, key: str, source: Path, target: Path) -> None:
    """Copy a file or directory tree (symlinks kept as links, modes and times kept)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        elif source.exists():
            shutil.copy2(source, target)
        else:
            raise FileNotFoundError(2, "no such file or directory")
    except (OSError, shutil.Error) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UpstreamError(
            f"sandbox {server!r}: cannot copy {key} {str(source)!r} for an instance: {detail}; "
            f"fix '{key}' in its [servers.{server}] table"
        ) from None


def _substitute(
    state: str, command: str, args: list[str], env: dict[str, str], cwd: str | None
) -> tuple[str, list[str], dict[str, str], str | None]:
    """``{state}`` replaced by ``state`` in command, args, env values and cwd."""

    def sub(value: str) -> str:
        return value.replace(STATE_PLACEHOLDER, state)

    return sub(command), [sub(a) for a in args], {k: sub(v) for k, v in env.items()}, cwd and sub(cwd)
