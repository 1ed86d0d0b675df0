"""Thread dumps of sglang scheduler processes, and the threads each release should run.

    import forensics as fx
    from forensics.threads import dump_threads, expected_threads, check_threads, diff_dumps

    dump = dump_threads(host, [pid], py_spy="/opt/venv/bin/py-spy", sudo=True)
    expected = expected_threads("0.5.15", "nixl")          # read from the release's own source
    check = check_threads(dump, expected, role="prefill")  # .ok, .findings, .frame
    diff_dumps(dump_before, dump_after)                    # appeared / vanished / top_changed
    check_dump_files(["prefill.log", "dump.txt"], sglang="0.5.15", role="prefill")  # dumps people have

See docs/threads.md for the frame schemas, the rules and every INCONCLUSIVE reason.
"""

from forensics.threads.check import ThreadCheck, check_threads
from forensics.threads.diff import diff_dumps
from forensics.threads.dump import ThreadDump, dump_threads, parse_dump
from forensics.threads.expected import ExpectedThread, ExpectedThreads, NoKVManager, expected_threads
from forensics.threads.filecheck import DumpFileCheck, check_dump_files
from forensics.threads.schema import THREAD_COLUMNS
from forensics.threads.textdump import ReadDump, read_dump_file

__all__ = [
    "THREAD_COLUMNS",
    "DumpFileCheck",
    "ReadDump",
    "check_dump_files",
    "read_dump_file",
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
