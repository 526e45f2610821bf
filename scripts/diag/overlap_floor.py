"""What copy-engine traffic alone costs a bf16 matmul loop: the floor under the overlap target.

One process drives both GPUs (no smddp, no NCCL): each runs the benchmark's matmul loop
(200 bf16 8192x8192 matmuls) on its default stream while a side stream moves what one rank of
a 256 MiB SDP AllGather moves, `reps` times: its 128 MiB input into its own output (a local
copy) and into the peer's output (a push over NVLink), both by cudaMemcpyAsync, that is, the
copy engines. `push` leaves the local copy out. Prints each GPU's matmul throughput lost
against the loop alone (median of 3 runs), to set beside `bench_torch.py --overlap`.

    python3 scripts/diag/overlap_floor.py [REPS]    # default 510, about the benchmark's count
"""
import statistics
import sys

import torch


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 510
    if torch.cuda.device_count() < 2:
        print("overlap_floor: needs 2 GPUs")
        return 0
    devs = [torch.device("cuda", i) for i in range(2)]
    m, k = 8192, 200
    per = (256 << 20) // 2 // 2  # bf16 elements of one rank's input (128 MiB)
    a = [torch.randn(m, m, device=d, dtype=torch.bfloat16) for d in devs]
    b = [torch.randn(m, m, device=d, dtype=torch.bfloat16) for d in devs]
    inp = [torch.ones(per, device=d, dtype=torch.bfloat16) for d in devs]
    out = [torch.empty(2 * per, device=d, dtype=torch.bfloat16) for d in devs]
    side = [torch.cuda.Stream(device=d) for d in devs]
    idle = [torch.cuda.Stream(device=d) for d in devs]

    def window(form, n):
        for d in devs:
            torch.cuda.synchronize(d)
        for i in range(2):
            if form == "alone":
                break
            peer = 1 - i
            # torch orders a copy between devices after the destination device's current
            # stream, and that stream after it: make that an idle stream, not the matmuls'.
            with torch.cuda.stream(idle[peer]), torch.cuda.stream(side[i]):
                for _ in range(n):
                    if form == "local+push":
                        out[i][i * per:(i + 1) * per].copy_(inp[i], non_blocking=True)
                    out[peer][i * per:(i + 1) * per].copy_(inp[i], non_blocking=True)
        ev = []
        for i, d in enumerate(devs):
            with torch.cuda.device(d):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(k):
                    torch.mm(a[i], b[i])
                e.record()
                ev.append((s, e))
        for d in devs:
            torch.cuda.synchronize(d)
        return [s.elapsed_time(e) for s, e in ev]

    for i in range(2):  # peer access, warm-up
        out[1 - i][:per].copy_(inp[i])
        for _ in range(3):
            torch.mm(a[i], b[i])
    window("local+push", 5)
    def copies_ms(form, n=20):
        """Milliseconds per AllGather share with nothing beside it (GPU 0's side stream)."""
        for d in devs:
            torch.cuda.synchronize(d)
        ev = []
        for i in range(2):
            peer = 1 - i
            with torch.cuda.stream(idle[peer]), torch.cuda.stream(side[i]):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(n):
                    if form == "local+push":
                        out[i][i * per:(i + 1) * per].copy_(inp[i], non_blocking=True)
                    out[peer][i * per:(i + 1) * per].copy_(inp[i], non_blocking=True)
                e.record()
                ev.append((s, e))
        for d in devs:
            torch.cuda.synchronize(d)
        return [s.elapsed_time(e) / n for s, e in ev]

    forms = ["alone", "local+push", "push"]
    runs = {f: [] for f in forms}
    for _ in range(3):
        for f in forms:
            runs[f].append(window(f, reps))
    alone = [statistics.median(r[i] for r in runs["alone"]) for i in range(2)]
    flop = 2.0 * m * m * m * k
    print("# overlap floor: %d bf16 %dx%d matmuls per GPU; side stream: %d copies of a 256 MiB SDP AllGather's"
          " share, copy engines only" % (k, m, m, reps))
    for i in range(2):
        print("GPU %d matmul alone: %.1f TFLOP/s" % (i, flop / alone[i] / 1e9))
    for f in forms[1:]:
        ms = copies_ms(f)
        print("%-10s alone: %.3f / %.3f ms per AllGather share on GPU 0 / 1 (push %.0f GB/s)" % (
            f, ms[0], ms[1], per * 2 / ms[0] / 1e6))
    for f in forms[1:]:
        for i in range(2):
            ms = [r[i] for r in runs[f]]
            lost = [1.0 - alone[i] / x for x in ms]
            print("%-10s GPU %d: matmul %.1f TFLOP/s, throughput lost %.1f%% (runs: %s)" % (
                f, i, flop / statistics.median(ms) / 1e9, 100 * statistics.median(lost),
                " ".join("%.1f%%" % (100 * x) for x in lost)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
