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
    benchmarks = discover()
    if argv and argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip().split("\n")[0])
        for name, module in sorted(benchmarks.items()):
            print(f"  {name:24} {module.BENCHMARK}")
        return 0
    if argv:
        name, rest = argv[0], argv[1:]
        if name not in benchmarks:
            print(f"no benchmark {name!r}; known: {', '.join(sorted(benchmarks))}", file=sys.stderr)
            return 2
        return benchmarks[name].main(rest)
    status = 0
    for name, module in sorted(benchmarks.items()):
        print(f"== {name}: {module.BENCHMARK}", file=sys.stderr)
        status = max(status, module.main([]))
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
