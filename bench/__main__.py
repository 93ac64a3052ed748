"""Run every benchmark: each ``bench/*.py`` module's ``main()``, in name order."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench
from replay_sim.resolve.runtime import configure_runtime


def main() -> int:
    """Run all benchmark modules (or those named on the command line); returns the exit status."""
    configure_runtime()  # measure replay-sim as its entry points run it
    wanted = set(sys.argv[1:])
    failed = 0
    for module_info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_") or (wanted and module_info.name not in wanted):
            continue
        module = importlib.import_module(f"bench.{module_info.name}")
        run = getattr(module, "main", None)
        if run is None:
            continue
        print(f"== bench.{module_info.name}", flush=True)
        started = time.perf_counter()
        try:
            run()
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            failed += 1
            print(f"   failed: {type(exc).__name__}: {exc}", flush=True)
        print(f"   ({time.perf_counter() - started:.1f}s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
