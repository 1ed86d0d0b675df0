"""One look at a sandbox: the loop's thread, its rooms and what it raised, rendered for people.

``EngineSandbox.snapshot()`` returns a :class:`SandboxSnapshot`; the sandbox itself renders
through it in JupyterLab (``_repr_html_``) and the terminal (``__rich__``); ``to_frame()``
gives the rooms as a table.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

KVPOLL_NAMES = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring", 4: "Success"}


@dataclass
class SandboxSnapshot:
    version: str
    backend: str
    patched: str | None  # the replacement conn file, when one is loaded
    endpoint: str | None
    alive: bool
    rooms: dict[int, int]
    exceptions: list[dict] = field(default_factory=list)
    consumed: int | None = None
    closed: bool = False

    @property
    def title(self) -> str:
        which = f"patched ({self.patched})" if self.patched else "unpatched"
        return f"sglang {self.version} {self.backend} {which}"

    @property
    def thread_word(self) -> str:
        if self.alive:
            return "bootstrap thread alive"
        if self.exceptions:
            death = self.exceptions[0]
            return f"bootstrap thread DEAD: {death['exc_type']}: {death['message']} ({death['file']}:{death['line']})"
        return "bootstrap thread not running"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(
            {"room": list(self.rooms), "state": [KVPOLL_NAMES.get(v, str(v)) for v in self.rooms.values()],
             "kvpoll": list(self.rooms.values())}
        )

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title, show_lines=False)
        table.add_column("room", justify="right")
        table.add_column("state")
        for room, value in sorted(self.rooms.items()):
            table.add_row(str(room), KVPOLL_NAMES.get(value, str(value)))
        style = "green" if self.alive else "bold red"
        return Group(Text(self.thread_word, style=style), table)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{room}</td><td>{KVPOLL_NAMES.get(value, value)}</td></tr>"
            for room, value in sorted(self.rooms.items())
        )
        colour = "green" if self.alive else "#b00"
        return (
            f"<div><b>{html.escape(self.title)}</b>"
            f"<div style='color:{colour}'>{html.escape(self.thread_word)}</div>"
            f"<table><tr><th>room</th><th>state</th></tr>{rows}</table></div>"
        )
