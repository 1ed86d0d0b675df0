"""Thread dumps of sglang scheduler processes, and the threads each release should run.

    import forensics as fx
    from forensics.threads import dump_threads, expected_threads, check_threads, diff_dumps

    dump = dump_threads(host, [pid], py_spy="/opt/venv/bin/py-spy", sudo=True)
    expected = expected_threads("0.5.15", "nixl")          # read from the release's own source
    check = check_threads(dump, expected, role="prefill")  # .ok, .findings, .frame
    diff_dumps(dump_before, dump_after)                    # appeared / vanished / top_changed

See docs/threads.md for the frame schemas, the rules and every INCONCLUSIVE reason.
"""

from forensics.threads.check import ThreadCheck, check_threads
from forensics.threads.diff import diff_dumps
from forensics.threads.dump import ThreadDump, dump_threads, parse_dump
from forensics.threads.expected import ExpectedThread, ExpectedThreads, NoKVManager, expected_threads
from forensics.threads.schema import THREAD_COLUMNS

__all__ = [
    "THREAD_COLUMNS",
    "ExpectedThread",
    "ExpectedThreads",
    "NoKVManager",
    "ThreadCheck",
    "ThreadDump",
    "check_threads",
    "diff_dumps",
    "dump_threads",
    "expected_threads",
    "parse_dump",
]
