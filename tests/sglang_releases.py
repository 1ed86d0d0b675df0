"""The sglang releases the per-release sweeps cover: every release on PyPI from 0.5.1 to 0.5.23 (42)."""

FIRST, LAST = "0.5.1", "0.5.23"
EVERY_RELEASE = tuple([f"0.5.{n}" for n in range(1, 24)] + [
    "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3",
    "0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3",
    "0.5.6.post1", "0.5.6.post2", "0.5.8.post1", "0.5.10.post1", "0.5.12.post1", "0.5.13.post1",
    "0.5.15.post1",
])
