"""How a rank finds its environment and its node's smddp daemon.

Launch path 1, ``smddprun ... -- python train.py``: the daemon spawned this process and set
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, SMDDP_JOB_ID and
SMDDP_NODE_ID. Nothing to do.

Launch path 2, plain ``mpirun -np N python train.py`` or torchrun: the ranks start first.
:func:`map_launcher_env` fills RANK/... from what the launcher set (Open MPI, PMI, Slurm) so
``init_process_group``'s default ``env://`` works, and :func:`ensure_daemon` gets a daemon
started: the ranks agree on a job id through the c10d Store, local rank 0 runs
``smddp-daemon --attach-mode`` detached from the job, and every rank then attaches to it. The
daemon exits by itself once every rank has detached or died, so it never outlives the job.

Environment read under launch path 2 (all optional):

* ``SMDDP_DAEMON``: the smddp-daemon program (default: the one of the build this package
  belongs to, else ``smddp-daemon`` on PATH).
* ``SMDDP_CONFIG``: a daemon configuration file (``--config``), e.g. configs/local.ini.
* ``SMDDP_DAEMON_LOG``: a file the daemon appends its log to (default: local rank 0's stderr).
* ``SMDDP_ATTACH_TIMEOUT``: seconds a rank waits for its daemon (default 30).
* ``SMDDP_SIMULATE_NODES=K``: split the job's ranks into K simulated nodes on this machine
  (rank r on node r // (world/K)), one daemon each, talking over libfabric on loopback: the
  path-2 counterpart of ``smddprun --simulate-nodes K``.

Across nodes, every node's local rank 0 starts its daemon with SMDDP_BOOTSTRAP_DIR set to a
fresh private folder; the daemon opens its fabric endpoints and writes "CARD PID HOST ADDRESS" to
DIR/address (CARD: its node card in hex, every endpoint's name and which endpoint serves each
local slot; ADDRESS: its first endpoint's printable name; only daemons read it); local rank 0 publishes that line in the Store, gathers every
node's, writes them in node order to DIR/peers (the daemon waits for it) and removes the folder
once the daemon is up.
Ranks must be placed node by node (rank = node * ranks_per_node + local rank, as mpirun's
default by-slot mapping and torchrun do), with as many ranks on every node.
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from smdistributed.dataparallel.exceptions import (
    SMDDPDaemonUnreachableError,
    SMDDPError,
    SMDDPInvalidArgumentError,
    SMDDPUnsupportedError,
)

# (variable torch reads, sources in order of preference)
_ENV_SOURCES = (
    ("RANK", ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")),
    ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")),
    ("LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")),
    ("LOCAL_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")),
)

# Where each rank's local layout comes from under launch path 2, in order of preference:
# torchrun, then Open MPI (map_launcher_env normally copied these already).
_LOCAL_LAYOUT_SOURCES = (
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = "29500"

# Set beside SMDDP_JOB_ID when this package started the daemon (launch path 2), so a later
# init_process_group in the same process knows the job id is its own and not smddprun's.
ATTACH_MARKER = "SMDDP_ATTACH_MODE"

# Seconds local rank 0 waits for the daemon it started to create its segment.
DAEMON_START_TIMEOUT_S = 30.0
# Seconds the daemon waits for the first rank to attach before it gives up and exits (so a
# job that dies before attaching leaves nothing behind).
DAEMON_ATTACH_TIMEOUT_S = 60

# Store keys (inside the default group's store). The generation makes every
# init_process_group of a process use fresh keys, also when the store is reused.
_JOB_KEY = "smddp/launch/%d/job_id"
_DAEMON_KEY = "smddp/launch/%d/daemon/node%d"
_HOST_KEY = "smddp/launch/%d/host/%d"
_ATTACHED_KEY = "smddp/launch/%d/attached/%d"
_ADDRESS_KEY = "smddp/launch/%d/address/node%d"

_generation = 0
_daemon_proc = None  # the Popen of the daemon this process started (kept so it is reaped)


def map_launcher_env(environ=None):
    """Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
    the launcher's variables where they are missing. Returns the names it set."""
    env = os.environ if environ is None else environ
    set_names = []
    for name, sources in _ENV_SOURCES:
        if name in env:
            continue
        for src in sources:
            if src in env:
                env[name] = env[src]
                set_names.append(name)
                break
    if "RANK" in env and "WORLD_SIZE" in env:
        # A single-node default; multi-node mpirun jobs must export MASTER_ADDR themselves.
        if "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = DEFAULT_MASTER_ADDR
            set_names.append("MASTER_ADDR")
        if "MASTER_PORT" not in env:
            env["MASTER_PORT"] = DEFAULT_MASTER_PORT
            set_names.append("MASTER_PORT")
    if "LOCAL_RANK" in env and "SMDATAPARALLEL_LOCAL_RANK" not in env:
        # Hugging Face Transformers' SageMaker path reads this one.
        env["SMDATAPARALLEL_LOCAL_RANK"] = env["LOCAL_RANK"]
    return set_names


def launched_by_smddprun(environ=None):
    """True under launch path 1: smddprun's daemon set SMDDP_JOB_ID (and this package did not)."""
    env = os.environ if environ is None else environ
    return "SMDDP_JOB_ID" in env and env.get(ATTACH_MARKER) != "1"


def ensure_daemon(store, rank, world_size):
    """Makes sure this rank's node has a daemon for the job before the backend attaches.

    Called once per default (world) group, with the Store that init_process_group created;
    subgroups reuse the job id this leaves in the environment.
    """
    if launched_by_smddprun():
        return
    start_attach_mode_daemon(store, rank, world_size)


def local_layout(store, rank, world_size, environ=None):
    """(local_rank, local_world_size) of this rank: from torchrun's or Open MPI's variables,
    else by comparing host names through the store (every rank must call it then)."""
    env = os.environ if environ is None else environ
    for lr_name, lws_name in _LOCAL_LAYOUT_SOURCES:
        if lr_name in env and lws_name in env:
            try:
                local_rank, local_size = int(env[lr_name]), int(env[lws_name])
            except ValueError:
                raise SMDDPInvalidArgumentError(
                    "smddp: %s=%r and %s=%r must be integers" % (lr_name, env[lr_name], lws_name, env[lws_name]))
            if not 0 <= local_rank < local_size <= world_size:
                raise SMDDPInvalidArgumentError(
                    "smddp: inconsistent layout: %s=%d, %s=%d, world size %d"
                    % (lr_name, local_rank, lws_name, local_size, world_size))
            return local_rank, local_size
    # No launcher told us: the ranks on this host are the ones with this host's name.
    host = socket.gethostname()
    store.set(_HOST_KEY % (_generation, rank), host)
    hosts = [store.get(_HOST_KEY % (_generation, r)).decode() for r in range(world_size)]
    same = [r for r in range(world_size) if hosts[r] == host]
    return same.index(rank), len(same)


def find_daemon():
    """The smddp-daemon program: $SMDDP_DAEMON, else the one beside this package's build, else
    PATH. Raises SMDDPDaemonUnreachableError saying where it looked."""
    explicit = os.environ.get("SMDDP_DAEMON")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise SMDDPDaemonUnreachableError(
            "smddp: SMDDP_DAEMON=%s is not an executable file; point it at the smddp-daemon program, "
            "or launch with `smddprun --nproc-per-node N -- python train.py`" % explicit)
    tried = []
    for bin_dir in _build_bin_dirs():
        path = os.path.join(bin_dir, "smddp-daemon")
        tried.append(path)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("smddp-daemon")
    if found:
        return found
    raise SMDDPDaemonUnreachableError(
        "smddp: cannot start an smddp daemon for this job: the smddp-daemon program was not found "
        "(tried %s and PATH). Set SMDDP_DAEMON to it, put its folder on PATH, or launch with "
        "`smddprun --nproc-per-node N -- python train.py`" % (", ".join(tried) or "no build folder"))


def _build_bin_dirs():
    """Candidate bin/ folders of the build this package belongs to."""
    dirs = []
    try:
        from smdistributed.dataparallel import _paths  # written by CMake at configure time
        dirs.append(_paths.BIN_DIR)
    except ImportError:
        pass
    # <build>/python/smdistributed/dataparallel/torch/_launch.py -> <build>/bin. Not resolved
    # through symlinks: the build tree links the sources' .py files.
    here = os.path.dirname(os.path.abspath(__file__))
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here)))), "bin"))
    return list(dict.fromkeys(dirs))


def _segment_path(job_id, node_id):
    from smdistributed.dataparallel.torch import _smddp_c
    return os.path.join("/dev/shm", _smddp_c.segment_name(job_id, node_id))


def _new_job_id():
    # "pt-" + 12 hex digits: valid for ipc::check_job_id, unique enough per machine.
    return "pt-%s" % secrets.token_hex(6)


def _exchange_addresses(store, gen, node_id, num_nodes, nproc_per_node, bootstrap_dir, proc, cmd, where):
    """Across nodes: publish this node's daemon address line in the store, gather every node's,
    and hand them to the daemon as DIR/peers (see the module's docstring)."""
    address = os.path.join(bootstrap_dir, "address")
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while not os.path.exists(address):
        rc = proc.poll()
        if rc is not None:
            raise SMDDPDaemonUnreachableError(
                "smddp: the smddp daemon started for this job exited with status %d before opening its fabric "
                "endpoint (command: %s; %s)" % (rc, " ".join(cmd), where))
        if time.monotonic() > deadline:
            raise SMDDPDaemonUnreachableError(
                "smddp: the smddp daemon started for this job (pid %d) did not open its fabric endpoint within "
                "%.0f s (%s)" % (proc.pid, DAEMON_START_TIMEOUT_S, where))
        time.sleep(0.005)
    with open(address) as f:
        line = f.read().strip()
    store.set(_ADDRESS_KEY % (gen, node_id), "%d %s" % (nproc_per_node, line))
    lines = []
    for n in range(num_nodes):
        nproc, peer = store.get(_ADDRESS_KEY % (gen, n)).decode().split(" ", 1)
        if int(nproc) != nproc_per_node:
            raise SMDDPInvalidArgumentError(
                "smddp: node %d runs %s rank(s) and node %d runs %d: smddp needs the same number of ranks on every "
                "node" % (n, nproc, node_id, nproc_per_node))
        lines.append(peer)
    tmp = os.path.join(bootstrap_dir, "peers.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, os.path.join(bootstrap_dir, "peers"))


def _spawn_daemon(job_id, node_id, num_nodes, nproc_per_node, store=None, gen=0):
    """Starts ``smddp-daemon --attach-mode`` in its own session (so the launcher's signals to
    the ranks' process group do not reach it; it exits by itself when the ranks are gone) and
    waits until its segment exists. Returns its pid; raises SMDDPDaemonUnreachableError."""
    global _daemon_proc
    daemon = find_daemon()
    cmd = [daemon, "--attach-mode", "--job-id", job_id, "--node-id", str(node_id), "--num-nodes", str(num_nodes),
           "--nproc-per-node", str(nproc_per_node), "--attach-timeout", str(DAEMON_ATTACH_TIMEOUT_S)]
    config = os.environ.get("SMDDP_CONFIG")
    if config:
        cmd += ["--config", os.path.abspath(config)]
    log_path = os.environ.get("SMDDP_DAEMON_LOG")
    log = open(log_path, "ab") if log_path else None
    bootstrap_dir = tempfile.mkdtemp(prefix="smddp-boot-") if num_nodes > 1 else None
    env = dict(os.environ, SMDDP_BOOTSTRAP_DIR=bootstrap_dir) if bootstrap_dir else None
    try:
        sys.stderr.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log or 2, env=env,
                                stderr=log or 2, close_fds=True, start_new_session=True)
    except OSError as e:
        if bootstrap_dir:
            shutil.rmtree(bootstrap_dir, ignore_errors=True)
        raise SMDDPDaemonUnreachableError("smddp: cannot start %s: %s" % (" ".join(cmd), e)) from e
    finally:
        if log:
            log.close()
    _daemon_proc = proc
    where = "its log is in %s" % log_path if log_path else "its log is on local rank 0's stderr"
    if bootstrap_dir:
        try:
            _exchange_addresses(store, gen, node_id, num_nodes, nproc_per_node, bootstrap_dir, proc, cmd, where)
        except BaseException:
            proc.kill()
            proc.wait()
            shutil.rmtree(bootstrap_dir, ignore_errors=True)
            raise
        # The daemon removes the files once read; the folder goes once the segment is up.
    try:
        segment = _segment_path(job_id, node_id)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while not os.path.exists(segment):
            rc = proc.poll()
            if rc is not None:
                raise SMDDPDaemonUnreachableError(
                    "smddp: the smddp daemon started for this job exited with status %d before it was ready "
                    "(command: %s; %s)" % (rc, " ".join(cmd), where))
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise SMDDPDaemonUnreachableError(
                    "smddp: the smddp daemon started for this job (pid %d) did not create its segment %s within "
                    "%.0f s (command: %s; %s)" % (proc.pid, segment, DAEMON_START_TIMEOUT_S, " ".join(cmd), where))
            time.sleep(0.005)
    finally:
        if bootstrap_dir:
            shutil.rmtree(bootstrap_dir, ignore_errors=True)
    return proc.pid


def _attached_job_to_reuse(store, gen, rank, world_size):
    """After destroy_process_group() + init_process_group(), a rank may still be attached to
    the daemon of the previous init (its client lives while any smddp group object does).
    All ranks still attached to one job: reuse it (returns its id). None attached: None (start a
    new daemon). Mixed: an error, since the ranks would talk to different daemons. Decided the
    same way on every rank from what all of them publish in the store."""
    if gen == 0:
        return None  # the first init of this process: nobody can be attached yet
    from smdistributed.dataparallel.torch import _smddp_c
    info = _smddp_c.client_info()
    mine = info["job_id"] if info else "none"
    store.set(_ATTACHED_KEY % (gen, rank), mine)
    jobs = [store.get(_ATTACHED_KEY % (gen, r)).decode() for r in range(world_size)]
    if all(j == "none" for j in jobs):
        return None
    if len(set(jobs)) == 1:
        return jobs[0]
    raise SMDDPError(
        "smddp: init_process_group after destroy_process_group: some ranks still hold smddp process groups of "
        "the previous init (attached jobs by rank: %s). Drop every reference to the old groups (e.g. from "
        "new_group) on every rank, or on none, before initializing again" % dict(enumerate(jobs)))


def start_attach_mode_daemon(store, rank, world_size):
    """Launch path 2: agree on a job id through ``store``, have local rank 0 start
    ``smddp-daemon --attach-mode``, and leave SMDDP_JOB_ID/SMDDP_NODE_ID (and RANK, ...) in the
    environment for the client, subgroups and the v1 API.

    Every rank of the default group must call it (it talks through the store)."""
    global _generation
    env = os.environ
    local_rank, local_world_size = local_layout(store, rank, world_size)
    simulate = env.get("SMDDP_SIMULATE_NODES")
    if simulate:
        # The override: this machine's ranks split into K simulated nodes, node by node.
        try:
            k = int(simulate)
        except ValueError:
            k = 0
        if k < 1 or world_size % k:
            raise SMDDPInvalidArgumentError(
                "smddp: SMDDP_SIMULATE_NODES=%s must be a positive divisor of the world size %d" % (simulate, world_size))
        local_world_size = world_size // k
        local_rank = rank % local_world_size
    num_nodes = world_size // local_world_size
    node_id = rank // local_world_size
    if world_size % local_world_size or node_id * local_world_size + local_rank != rank:
        raise SMDDPUnsupportedError(
            "smddp: rank %d is local rank %d of %d on its node: smddp needs the ranks placed node by node "
            "(rank = node * ranks_per_node + local rank) with as many ranks on every node (mpirun's default "
            "--map-by slot and torchrun do this)" % (rank, local_rank, local_world_size))

    gen = _generation
    _generation += 1
    reuse = _attached_job_to_reuse(store, gen, rank, world_size)
    if reuse:
        return reuse
    if rank == 0:
        job_id = _new_job_id()
        store.set(_JOB_KEY % gen, job_id)
    else:
        job_id = store.get(_JOB_KEY % gen).decode()

    # What the client reads (AttachOptions::from_env), set before anyone attaches.
    env["SMDDP_JOB_ID"] = job_id
    env["SMDDP_NODE_ID"] = str(node_id)
    env[ATTACH_MARKER] = "1"
    env["RANK"] = str(rank)
    env["WORLD_SIZE"] = str(world_size)
    env["LOCAL_RANK"] = str(local_rank)
    env["LOCAL_WORLD_SIZE"] = str(local_world_size)
    env.setdefault("SMDATAPARALLEL_LOCAL_RANK", str(local_rank))

    key = _DAEMON_KEY % (gen, node_id)
    if local_rank == 0:
        try:
            pid = _spawn_daemon(job_id, node_id, num_nodes, local_world_size, store, gen)
        except SMDDPError as e:
            store.set(key, "error " + str(e))  # the other ranks fail with the reason, not a timeout
            raise
        store.set(key, "ok %d" % pid)
    else:
        status = store.get(key).decode()
        if not status.startswith("ok"):
            raise SMDDPDaemonUnreachableError(
                "smddp: local rank 0 could not start the smddp daemon of this job: %s" % status.split(" ", 1)[-1])
    return job_id
