"""A/B: the same campaign against two deployments (unpatched and patched), side by side.

    ab = fx.validation.compare(unpatched_twin, patched_twin, cycles=2)
    ab                     # a table: per cycle and check, A's status next to B's

The comparison's answer is B's: the patched side must PASS (exit 0); A is the control,
expected to FAIL on an affected release (that it does is shown, not required). The two
campaigns run one after the other, never at once (they would share the CPU and the
storm's timing with each other).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from forensics.exitcodes import ExitStatus

from .checks import CHECKS, COLOUR, STYLE
from .result import Campaign


@dataclass
class Comparison:
    a: Campaign
    b: Campaign
    labels: tuple[str, str] = ("unpatched", "patched")

    @property
    def status(self) -> str:
        return self.b.status

    @property
    def exit_status(self) -> ExitStatus:
        return self.b.exit_status

    def summary(self) -> str:
        la, lb = self.labels
        return f"{la}: {self.a.summary()} | {lb}: {self.b.summary()}"

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(cycle, check, A's status, B's status) for every cycle either side ran."""
        out = []
        if self.a.deploy is not None or self.b.deploy is not None:
            out.append(("-", "deploy", self.a.deploy.status if self.a.deploy else "-",
                        self.b.deploy.status if self.b.deploy else "-"))
        last = max([cy.cycle for cy in self.a.cycles + self.b.cycles], default=0)
        for n in range(1, last + 1):
            a = {c.name: c.status for cy in self.a.cycles if cy.cycle == n for c in cy.checks}
            b = {c.name: c.status for cy in self.b.cycles if cy.cycle == n for c in cy.checks}
            for name in CHECKS:
                out.append((str(n), name, a.get(name, "-"), b.get(name, "-")))
        return out

    def to_dict(self) -> dict[str, Any]:
        la, lb = self.labels
        return {"summary": self.summary(), "labels": list(self.labels),
                "side_by_side": [{"cycle": c, "check": k, la: x, lb: y} for c, k, x, y in self.rows()],
                "a": self.a.to_dict(), "b": self.b.to_dict()}

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        la, lb = self.labels
        table = Table(title=f"A/B: {self.a.deployment} ({la}) vs {self.b.deployment} ({lb})")
        for heading in ("cycle", "check", la, lb):
            table.add_column(heading)
        for cycle, name, x, y in self.rows():
            table.add_row(cycle, name, Text(x, style=STYLE.get(x, "")), Text(y, style=STYLE.get(y, "")))
        return Group(table, Text(f"{la}: {self.a.summary()}", style=STYLE[self.a.status]),
                     Text(f"{lb}: {self.b.summary()}", style=STYLE[self.b.status]))

    def _repr_html_(self) -> str:
        la, lb = self.labels

        def cell(status: str) -> str:
            return f"<td style='color:{COLOUR.get(status, 'inherit')}'>{status}</td>"

        rows = "".join(f"<tr><td>{c}</td><td>{k}</td>{cell(x)}{cell(y)}</tr>" for c, k, x, y in self.rows())
        return (f"<b>A/B</b>: {html.escape(self.summary())}<table><tr><th>cycle</th><th>check</th>"
                f"<th>{html.escape(la)}</th><th>{html.escape(lb)}</th></tr>{rows}</table>")


def compare(a: Any, b: Any, *, labels: tuple[str, str] = ("unpatched", "patched"), deploy_b: bool = False,
            **options: Any) -> Comparison:
    """Run the same campaign (``validate``'s options) against ``a`` and then ``b``.

    ``deploy_b``: deploy the patch to ``b`` first (two inventories of one release, one to be
    patched); on two twins (one started ``patched=True``) there is nothing to deploy.
    """
    from .campaign import validate

    first = validate(a, **options)
    second = validate(b, deploy=deploy_b, **options)
    return Comparison(first, second, labels)
