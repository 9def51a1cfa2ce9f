"""The rings' side of test_same_bad_option.py: every case's keywords given to one ring, each error
message recorded (None when the call passed), rank 0 writing the list as JSON.

    python option_front_ends_worker.py torch CASES_JSON OUT_JSON
        qkv.torch.ring_attention in a process group of one rank (gloo on loopback)
    mpirun -np 2 python option_front_ends_worker.py mpi CASES_JSON OUT_JSON
        qkv.distributed.ring_attention on two ranks
"""

import json
import socket
import sys

import numpy as np


def shapes():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(3)]


def run_torch(cases):
    import torch
    import torch.distributed as dist

    import qkv.torch as qt
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    q, k, v = (torch.from_numpy(a) for a in shapes())
    got = []
    for kwargs in cases:
        try:
            qt.ring_attention(q, k, v, **kwargs)
            got.append(None)
        except (ValueError, TypeError) as e:
            got.append(str(e))
    dist.destroy_process_group()
    return got


def run_mpi(cases):
    from mpi4py import MPI

    import qkv.distributed as qd
    comm = MPI.COMM_WORLD
    q, k, v = (qd.shard(a, comm) for a in shapes())
    got = []
    for kwargs in cases:
        try:
            qd.ring_attention(comm, q, k, v, **kwargs)
            got.append(None)
        except (ValueError, TypeError) as e:
            got.append(str(e))
    return got if comm.Get_rank() == 0 else None


if __name__ == "__main__":
    mode, cases, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    got = run_torch(cases) if mode == "torch" else run_mpi(cases)
    if got is not None:
        with open(out, "w") as f:
            json.dump(got, f)
