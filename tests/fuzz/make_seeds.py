#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (corpus/<target>/): well-formed inputs the fuzzers mutate.
Request descriptors follow ipc/protocol.hpp's layout (RequestDesc: 408 bytes, BufferRef: 104)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def buffer(kind=0, offset=0, nbytes=0, alloc_bytes=0):
    return struct.pack("<B7xQQQQ", kind, offset, nbytes, 0, alloc_bytes) + bytes(64)


def request(op, dtype, count, chunk_offset, chunk_count, flags=0, root=0, wait_event=-1,
            inp=buffer(), out=buffer(), aux=buffer(), reduce_op=0):
    head = struct.pack("<QQQBBBBIiiQQQdIiIxxxxQ", 1, 7, 1, op, dtype, reduce_op, 0, flags, root, 0,
                       count, chunk_offset, chunk_count, 1.0, 0, wait_event, 0, 0)
    return head + inp + out + aux


def context(group_size, rank, cuda=0, events=0, arena_kib=64):
    return struct.pack("<BBBBI", group_size - 1, rank, cuda, events, arena_kib)


ARENA, CUDA = 1, 2
ALLREDUCE, BROADCAST, ALLGATHER, BARRIER = 0, 1, 3, None
write("request_validator", "allreduce", context(2, 0) + request(
    0, 0, 256, 0, 256, inp=buffer(ARENA, 0, 1024), out=buffer(ARENA, 1024, 1024)))
write("request_validator", "broadcast_root1", context(4, 2) + request(
    1, 1, 64, 0, 64, root=1, inp=buffer(ARENA, 0, 512), out=buffer(ARENA, 512, 512)))
write("request_validator", "allgather", context(2, 1) + request(
    3, 0, 16, 0, 16, inp=buffer(ARENA, 0, 64), out=buffer(ARENA, 64, 128)))
write("request_validator", "cuda_allreduce", context(2, 0, cuda=1, events=1) + request(
    0, 3, 1024, 0, 1024, wait_event=0, inp=buffer(CUDA, 0, 2048, 4096), out=buffer(CUDA, 0, 2048, 4096)))
write("request_validator", "empty", context(1, 0) + bytes(408))

with open(os.path.join(HERE, "..", "..", "configs", "local.ini"), "rb") as f:
    write("config", "local_ini", b"\x00" + f.read())
write("config", "overrides", b"\x01daemon.arena_mib=64\nfabric.endpoints=4\nfabric.algorithm=ring")
write("config", "sections", b"\x00[daemon]\nchunk_kib = 256\n[fabric]\nprovider = shm\n")

write("daemon_args", "smddprun", b"--nproc-per-node\x002\x00--config\x00configs/local.ini\x00--\x00python3\x00t.py")
write("daemon_args", "attach", b"--attach-mode\x00--node-id\x001\x00--num-nodes\x002\x00--attach-timeout=5")
write("daemon_args", "cleanup", b"--cleanup-job\x00smddp-1234")

write("control_request", "status", b"status\n")
write("control_request", "status_crlf", b"status\r\n")
write("control_request", "unknown", b"metrics\n")
