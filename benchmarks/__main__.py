"""``python -m benchmarks [NAME [ARGS...]]`` (``./run bench``): run one benchmark, or all of them.

A benchmark is a module of this package with a ``BENCHMARK`` description and a
``main(argv) -> int``; ``--list`` names them.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def discover() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        if hasattr(module, "BENCHMARK") and hasattr(module, "main"):
            found[info.name] = module
    return found


def main(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):
        # One benchmark: import only it, so another module's heavy or broken import cannot stop it.
        name, rest = argv[0], argv[1:]
        names = {info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])}
        module = importlib.import_module(f"benchmarks.{name}") if name in names else None
        if module is None or not (hasattr(module, "BENCHMARK") and hasattr(module, "main")):
            print(f"no benchmark {name!r}; `python -m benchmarks --list` names them", file=sys.stderr)
            return 2
        return module.main(rest)
    benchmarks = discover()
    if argv and argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip().split("\n")[0])
        for name, module in sorted(benchmarks.items()):
            print(f"  {name:24} {module.BENCHMARK}")
        return 0
    if argv:
        print(f"unknown option {argv[0]!r}; use --list or a benchmark name", file=sys.stderr)
        return 2
    status = 0
    for name, module in sorted(benchmarks.items()):
        print(f"== {name}: {module.BENCHMARK}", file=sys.stderr)
        status = max(status, module.main([]))
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
