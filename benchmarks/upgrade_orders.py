"""Rolling-upgrade orders across the releases, each decided by the releases' own code.

    python -m benchmarks upgrade_orders [--from 0.5.12] [--to 0.5.23] [--no-write]

For every step from one release to the next (and from each vulnerable release to the first
fixed one, 0.5.16, and from 0.5.15 to the newest), :func:`forensics.upgrade.plan_upgrade` runs the
pair check for both orders and the target's own pair; where no order works, ``find_via`` looks
for a release in between. The table goes to ``benchmarks/RESULTS.md`` with the time each plan
took (three pair checks in the engine sandbox). It is a reference for operators and a check of
the plan's sense: no verdict comes from a version list.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "rolling-upgrade order (prefills or decodes first) for each release step, from the pair check"
SECTION_START = "<!-- upgrade-orders:start -->"
SECTION_END = "<!-- upgrade-orders:end -->"
VULNERABLE = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1")
FIRST_FIXED = "0.5.16"


def steps(lower: str, upper: str) -> list[tuple[str, str]]:
    """Each release to the next, then each vulnerable release to the first fixed one and 0.5.15 to
    the newest (the jumps operators ask about)."""
    from forensics.sglang_source import available_releases

    releases = available_releases(lower, upper)
    pairs = list(zip(releases, releases[1:], strict=False))
    pairs += [(v, FIRST_FIXED) for v in VULNERABLE if v in releases and (v, FIRST_FIXED) not in pairs]
    if "0.5.15" in releases and ("0.5.15", releases[-1]) not in pairs:
        pairs.append(("0.5.15", releases[-1]))
    return pairs


def cell(order) -> str:
    """``clean``, or the state and the short name of each finding (the part before its colon)."""
    if order.state == "clean":
        return "clean"
    return f"{order.state}: " + "; ".join(line.split(":", 1)[0] for line in order.stops + order.costs)


def run(lower: str, upper: str) -> list[dict]:
    from forensics.upgrade import find_via, plan_upgrade

    rows = []
    for current, target in steps(lower, upper):
        started = time.perf_counter()
        plan = plan_upgrade(current, target)
        seconds = time.perf_counter() - started
        via = find_via(current, target) if plan.order == "neither" else None
        by_order = {o.order: o for o in plan.orders}
        rows.append({"from": current, "to": target, "order": plan.order, "seconds": seconds,
                     "prefills first": cell(by_order["prefills first"]),
                     "decodes first": cell(by_order["decodes first"]),
                     "warning": "target wedges on its own ABORT" if plan.warnings else "",
                     "via": f"{via[0].target} ({via[0].order}, then {via[1].order})" if via else "",
                     "exit": int(plan.exit_status)})
        print(f"{current} -> {target}: {plan.order} ({seconds:.1f} s)", flush=True)
    return rows


def section(rows: list[dict], lower: str, upper: str) -> str:
    load = os.getloadavg()
    times = [r["seconds"] for r in rows]
    lines = [
        SECTION_START,
        "## Rolling-upgrade orders (`python -m benchmarks upgrade_orders`)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, "
        f"releases {lower} to {upper}, NIXL. Each row is `forensics upgrade-order --from A --to B`: both mixed "
        "pairs and the target's own pair run through the pair check (each release's own code in the engine "
        "sandbox, and the decode hazard read from the decode's source). \"stops\": the mixed pair cannot serve "
        "or wedges on the first abort; \"costs\": it serves, worse than today while mixed.",
        "",
        f"{len(rows)} plans, median {statistics.median(times):.1f} s each (min {min(times):.1f} s, max "
        f"{max(times):.1f} s; three pair checks per plan).",
        "",
        "| from | to | take | prefills first | decodes first | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = "; ".join(x for x in (r["warning"], f"via {r['via']}" if r["via"] else "") if x)
        lines.append(f"| {r['from']} | {r['to']} | {r['order']} | {r['prefills first']} | {r['decodes first']} | "
                     f"{note} |")
    lines += ["", SECTION_END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("upgrade_orders", BENCHMARK)
    parser.add_argument("--from", dest="lower", default="0.5.12")
    parser.add_argument("--to", dest="upper", default="0.5.23")
    args = parser.parse_args(argv)
    rows = run(args.lower, args.upper)
    publish(section(rows, args.lower, args.upper), SECTION_START, SECTION_END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
