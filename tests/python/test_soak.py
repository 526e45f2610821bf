"""The soak: a randomized workload of host-tensor collectives (workers/soak_worker.py) across 2
simulated nodes x 2 ranks (one node of 4 where the build has no fabric transport), every result
checked against a reference; what the ranks and daemons hold is the same at the end as after the
warm-up. 1,000 operations here, 10,000 with SMDDP_LONG_TESTS=1 (scripts/test.sh --long)."""
import json
import os
import re

from conftest import run_job

LONG = os.environ.get("SMDDP_LONG_TESTS") == "1"
FABRIC = os.environ.get("SMDDP_HAVE_FABRIC", "ON").upper() not in ("OFF", "0", "FALSE")


def test_soak_mixed_collectives_resources_flat():
    ops = 10000 if LONG else 1000
    nodes = ("--simulate-nodes", "2") if FABRIC else ()
    res = run_job("soak_worker.py", 2 if FABRIC else 4, args=["--ops", str(ops), "--seed", "7"],
                  timeout=3000 if LONG else 280, smddprun_args=nodes)
    # Each rank runs the operations of the groups it belongs to: at least half of them.
    res.assert_ok(min_checks=ops // 2)
    snaps = dict(re.findall(r"^SMDDP-RESOURCES (start|end) (.*)$", res.records, re.M))
    assert set(snaps) == {"start", "end"}, res.output[-3000:]
    start, end = json.loads(snaps["start"]), json.loads(snaps["end"])
    for r, (a, b) in enumerate(zip(start, end)):
        for who in ("rank", "daemon"):
            if who not in a:
                continue
            x, y = a[who], b[who]
            assert y["fds"] == x["fds"], "rank %d's %s: open fds %d -> %d" % (r, who, x["fds"], y["fds"])
            assert y["threads"] == x["threads"], "rank %d's %s: threads %d -> %d" % (r, who, x["threads"],
                                                                                   y["threads"])
            # Allocators keep what the largest operations took; growth beyond that is a leak.
            grew = y["anon_kib"] - x["anon_kib"]
            assert grew <= 64 * 1024 + x["anon_kib"] // 10, "rank %d's %s: private RSS %d -> %d KiB" % (
                r, who, x["anon_kib"], y["anon_kib"])
        if "shm_bytes" in a:
            assert b["shm_bytes"] == a["shm_bytes"], "node of rank %d: /dev/shm %d -> %d bytes" % (
                r, a["shm_bytes"], b["shm_bytes"])
    print("resources start %s\nresources end   %s" % (snaps["start"], snaps["end"]))
