#!/usr/bin/env python3
"""A per-node cost model of a large AllReduce across p4d and p5 nodes, for docs/cost-model.md.

Each design moves known bytes over each of a node's resources (NVLink, each PCIe switch's uplink
to the host, host memory, the CPU's reduction, the EFA devices); with every phase pipelined, an
operation takes at least its busiest resource's bytes over that resource's rate. The rates are
published link rates or measured here (see RATES); the NCCL column is calibrated on the one
published multi-node p4d measurement (NVIDIA/nccl issue 527), and every design's fabric term
runs at that same efficiency (what NCCL gets from EFA); the last column is the ceiling at line
rate. Prints markdown tables.

  python3 scripts/cost_model.py [--gib 1] [--nodes 2,4,8,16,32,64,128,256]
"""
import argparse

GB = 1e9

# Per machine: GPUs, GPUs and EFA share of traffic per PCIe switch, rates in bytes/s.
MACHINES = {
    "p4d": dict(
        G=8,
        gpus_per_switch=2, nic_share_per_switch=1 / 4,   # 4 switches: 2 GPUs + 1 of 4 EFA devices each
        nvlink_busbw=232 * GB,      # A100 NVLink in-node AllReduce busbw: 1 GiB in 8.1 ms (NCCL issue 527)
        pcie_uplink=25 * GB,        # PCIe Gen4 x16, per direction, usable
        host_mem=170 * GB,          # 2 x 6 ch DDR4-2933: 282 GB/s peak, ~60% usable under mixed DMA + CPU
        efa=50 * GB,                # 4 x 100 Gb/s, per direction
        cores=16,                   # daemon worker threads reducing
    ),
    "p5": dict(
        G=8,
        gpus_per_switch=1, nic_share_per_switch=4 / 32,  # 8 switches: 1 GPU + 4 of 32 EFA devices each
        nvlink_busbw=480 * GB,      # H100 NVLink4 in-node AllReduce busbw (nccl-tests on 8x H100)
        pcie_uplink=50 * GB,        # PCIe Gen5 x16, per direction; H200 measured 53.6 GB/s device-to-host
        host_mem=250 * GB,          # 2 x 8 ch DDR4-3200 (EPYC 7R13): 410 GB/s peak, ~60% usable
        efa=400 * GB,               # 32 x 100 Gb/s, per direction
        cores=16,
    ),
}
CPU_REDUCE_PER_CORE = 9.4 * GB  # float32, 2 inputs, bytes out per second per core (host_reduce_bench)
NCCL_EFFICIENCY = 21.5 / 35.2   # NCCL's 1 GiB on 2x p4dn: 35.2 ms against 21.5 ms of EFA line rate


def designs(m, N, P, efa_efficiency):
    """Seconds each resource needs per design, for N bytes a GPU on P nodes; the fabric moves
    efa_efficiency of its line rate."""
    G, g_sw, f = m["G"], m["gpus_per_switch"], m["nic_share_per_switch"]
    S = 2 * N * (P - 1) / P  # what a node sends (and receives) for a reduce-scatter + all-gather among nodes
    nvl = 2 * N * (G - 1) / G / m["nvlink_busbw"]  # in-node reduce-scatter + all-gather

    def cpu(out_bytes, inputs):
        return out_bytes * inputs / 2 / (m["cores"] * CPU_REDUCE_PER_CORE)

    out = {}
    # Whole tensors through the arena: every GPU's N down and up PCIe, the node reduced on the
    # CPU, the result copied to each rank's arena, then across nodes as below.
    out["staged (before)"] = dict(
        pcie=(g_sw * N + f * S) / m["pcie_uplink"],
        host=(G * N + (G * N + N) + 2 * (G - 1) * N + 2 * S + (N + N / P) + G * N) / m["host_mem"],
        cpu=cpu(N, G) + cpu(N / P, P),
        efa=S / (m["efa"] * efa_efficiency), nvlink=0.0)
    # Built: reduce-scatter on NVLink, each GPU's shard N/G staged, daemons reduce across nodes on
    # the CPU, results staged back, all-gather by copy engines.
    out["hierarchical, CPU reduce (built)"] = dict(
        pcie=(g_sw * N / G + f * S) / m["pcie_uplink"],
        host=(N + 2 * S + (N + N / P) + N) / m["host_mem"],
        cpu=cpu(N / P, P), efa=S / (m["efa"] * efa_efficiency), nvlink=nvl)
    # The other nodes' parts copied to the GPU and reduced there; only the reduced part returns.
    k = (P - 1) * N / P
    out["hierarchical, GPU reduce"] = dict(
        pcie=(g_sw * (N / G + k / G) + f * S) / m["pcie_uplink"],
        host=(4 * k + N / P + 3 * k) / m["host_mem"],
        cpu=0.0, efa=S / (m["efa"] * efa_efficiency), nvlink=nvl)
    # The EFA devices read and write GPU memory (FI_HMEM), beside the GPU under the same switch.
    out["hierarchical, GPUDirect"] = dict(pcie=0.0, host=0.0, cpu=0.0, efa=S / (m["efa"] * efa_efficiency), nvlink=nvl)
    return out


def nccl(m, N, P):
    """NCCL with GPUDirect: the better of ring (2N(PG-1)/PG a node each way) and the double binary
    tree (2N(P-1)/P a node each way: N on 2 nodes, where each node is the other's only child),
    at the efficiency measured on 2 nodes."""
    G = m["G"]
    ring = 2 * N * (P * G - 1) / (P * G) / m["efa"]
    tree = 2 * N * (P - 1) / P / m["efa"]
    return min(ring, tree) / NCCL_EFFICIENCY


def bound(t):
    name = max(t, key=t.get)
    return t[name], name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--nodes", default="2,4,8,16,32,64,128,256")
    a = ap.parse_args()
    N = a.gib * 2**30
    nodes = [int(x) for x in a.nodes.split(",")]
    for name, m in MACHINES.items():
        print(f"\n#### {name}: {a.gib:g} GiB float32 AllReduce, ms (the binding resource)\n")
        heads = list(designs(m, N, 2, 1.0).keys())
        print("| nodes | " + " | ".join(heads) + " | NCCL | GPUDirect at EFA line rate |")
        print("|---:|" + "---|" * (len(heads) + 2))
        for P in nodes:
            row = []
            for d, t in designs(m, N, P, NCCL_EFFICIENCY).items():
                v, what = bound(t)
                row.append(f"{v * 1e3:.1f} ({what})")
            line, _ = bound(designs(m, N, P, 1.0)["hierarchical, GPUDirect"])
            print(f"| {P} | " + " | ".join(row) + f" | {nccl(m, N, P) * 1e3:.1f} | {line * 1e3:.1f} |")
        print("\nPer resource at 2 nodes, ms (fabric at NCCL's efficiency):\n")
        print("| design | " + " | ".join(designs(m, N, 2, 1.0)[heads[0]].keys()) + " |")
        print("|---|" + "---:|" * len(designs(m, N, 2, 1.0)[heads[0]]))
        for d, t in designs(m, N, 2, NCCL_EFFICIENCY).items():
            print(f"| {d} | " + " | ".join(f"{v * 1e3:.1f}" for v in t.values()) + " |")


if __name__ == "__main__":
    main()
