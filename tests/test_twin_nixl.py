"""Real NIXL (UCX, DRAM) between two processes: KV pages arrive intact, tags as sglang's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from forensics.twin import nixl_transfer as nx

DECODE_SIDE = textwrap.dedent(
    """
    import sys, time, numpy as np
    from forensics.twin import nixl_transfer as nx
    agent = nx.make_agent("decode-agent")
    pool = nx.PagePool(agent, num_pages=64, page_bytes=4096)
    sys.stdout.write("META " + agent.get_agent_metadata().hex() + " " + str(pool.base_ptr) + "\\n")
    sys.stdout.flush()
    room, nbytes, pages = int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")]
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        for peer, msgs in agent.get_new_notifs().items():
            seen.extend(m.decode() for m in msgs)
        time.sleep(0.001)
    ok = np.array_equal(pool.read(np.array(pages), nbytes), nx.kv_payload(room, nbytes))
    print("NOTIFS", ",".join(seen), "EQUAL", ok, flush=True)
    """
)


@pytest.mark.timeout(120)
def test_kv_pages_cross_processes_intact_with_sglang_tags():
    room, nbytes = 7461092837465012345, 3 * 4096 + 100  # a real 63-bit room (float64 would round it)
    pages = [7, 3, 50, 12]
    child = subprocess.Popen(
        [sys.executable, "-c", DECODE_SIDE, str(room), str(nbytes), ",".join(map(str, pages))],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = ""
        while not line.startswith("META "):  # NIXL logs its own lines on stdout first
            line = child.stdout.readline()
            assert line, "decode side exited before publishing its metadata"
        _, metadata_hex, base_ptr = line.split()
        agent = nx.make_agent("prefill-agent", num_threads=2)
        remote = agent.add_remote_agent(bytes.fromhex(metadata_hex))
        assert remote == b"decode-agent"
        source = nx.RegisteredSource(agent, 1 << 20)
        payload = source.view(nbytes)
        payload[:] = nx.kv_payload(room, nbytes)
        nx.write_pages(agent, "decode-agent", payload, int(base_ptr), 4096, np.array(pages), nx.kv_tag(room))
        aux = source.buffer[nbytes: nbytes + 8]
        nx.write_pages(agent, "decode-agent", aux, int(base_ptr), 4096, np.array([60]), nx.aux_tag(room))
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert f"NOTIFS {room}_kv_0_1_0,{room}_aux EQUAL True" in out


def test_payload_is_deterministic_per_room():
    room = 7461092837465012345  # float64 cannot tell it from its neighbours; the payload must
    assert np.array_equal(nx.kv_payload(room, 100), nx.kv_payload(room, 100))
    for other in (room + 1, room - 1, 2**63 - 1, 2**63):
        assert not np.array_equal(nx.kv_payload(room, 100), nx.kv_payload(other, 100)), other
    assert not np.array_equal(nx.kv_payload(2**63 - 1, 100), nx.kv_payload(2**63, 100))
    assert nx.kv_tag(room, 2, False, 1) == b"7461092837465012345_kv_2_0_1"
    assert nx.aux_tag(2**64 - 1) == b"18446744073709551615_aux"
    assert nx.pages_for(4097) == 2 and nx.pages_for(0) == 1
