"""One rank of qkv.torch.ring_attention under torchrun (test_torch_ring.py launches it).

    torchrun --nproc_per_node 2 torch_ring_worker.py check CASES_JSON OUT_JSON
        for each case every rank draws the whole q, k, v, dout from the case's seed, runs the ring
        on its shards for 1, 2 and 3 threads (forward, then backward through autograd), and rank 0
        writes the errors against the float64 reference and PyTorch's fp32 composite, and whether
        the thread counts agreed bitwise (one process start for all cases: it takes seconds).
    torchrun ... torch_ring_worker.py dropout -> ranks seeded apart run the ring with dropout: rank 0
        prints its errors against the single-process call seeded as rank 0 was
    torchrun ... torch_ring_worker.py bad    -> rank 1 passes a bad window: every rank prints its error
    torchrun ... torch_ring_worker.py fail   -> rank 1 raises before the ring: rank 0 must report it
    torchrun ... torch_ring_worker.py hang   -> rank 1 never calls the ring: rank 0 must time out
    torchrun ... torch_ring_worker.py fail_in_backward -> rank 1 exits after the forward: rank 0's
        backward must report the transfer that failed
"""

import datetime
import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import qkv.torch as qt
from py_oracle import torch_scores

TIMEOUT_SECONDS = 5


def composite(q, k, v, additive, scale, softcap):
    """softmax(q k^T * scale (softcapped) + additive) v in q's dtype; rows with no key give 0."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        softcap = float(np.float32(softcap))
        s = softcap * torch.tanh(s / softcap)
    s = s + additive.to(s.dtype)
    empty = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v


def with_grads(fn, dtype, tensors, dout):
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(dout.to(dtype))
    return [out.detach().double()] + [t.grad.double() for t in leaves]


def check(case):
    rank = dist.get_rank()
    rng = np.random.default_rng(case["seed"])
    B, H, Hkv, N, D, Dv = (case[key] for key in ("B", "H", "Hkv", "N", "D", "Dv"))
    shapes = ((B, H, N, D), (B, Hkv, N, D), (B, Hkv, N, Dv))
    q, k, v = (torch.from_numpy(rng.standard_normal(shape)) for shape in shapes)
    dout = torch.from_numpy(rng.standard_normal((B, H, N, Dv)))
    mask = {key: case[key] for key in ("causal", "causal_align", "window", "key_lengths", "alibi_slopes")
            if case.get(key) is not None}
    scale, softcap = case.get("scale") or 1 / np.sqrt(D), case.get("softcap")
    additive = torch_scores(np.zeros((B, H, N, D)), np.zeros((B, Hkv, N, D)), **mask)
    ref = with_grads(lambda *t: composite(*t, additive, scale, softcap), torch.float64, (q, k, v), dout)
    pt = with_grads(lambda *t: composite(*t, additive, scale, softcap), torch.float32, (q, k, v), dout)

    # A group of its own (the ring maps its ranks to global ones for send and receive).
    group = dist.new_group(list(range(dist.get_world_size()))) if case.get("group") else None
    runs = []
    for threads in (1, 2, 3):
        leaves = [qt.shard(t.float(), group, case["sharding"]).requires_grad_() for t in (q, k, v)]
        out, lse = qt.ring_attention(*leaves, group, **mask, softcap=softcap, scale=case.get("scale"),
                                     sharding=case["sharding"], num_threads=threads, return_lse=True)
        out.backward(qt.shard(dout.float(), group, case["sharding"]))
        results = [out.detach()] + [x.grad for x in leaves] + [lse.unsqueeze(-1)]
        runs.append([qt.unshard(t, group, case["sharding"]) for t in results])
    bitwise = all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
    got = [t.double() for t in runs[0]]
    names = ("out", "dq", "dk", "dv")
    result = {"bitwise": bitwise, "rank": rank}
    for name, g, r, p in zip(names, got, ref, pt):
        result[name] = {"err": (g - r).abs().max().item(), "pt_err": (p - r).abs().max().item(),
                        "max_ref": r.abs().max().item()}
    # The single-process call on the whole sequence, for the report.
    single = qt.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(case.get("causal")),
                                             enable_gqa=True, **{key: val for key, val in mask.items()
                                                                 if key not in ("causal",)},
                                             softcap=softcap, scale=case.get("scale"))
    result["vs_single"] = (runs[0][0].double() - single.double()).abs().max().item()
    _, single_lse = qt.scaled_dot_product_attention(q, k, v, is_causal=bool(case.get("causal")), enable_gqa=True,
                                                    **{key: val for key, val in mask.items() if key != "causal"},
                                                    softcap=softcap, scale=case.get("scale"), return_lse=True)
    ring_lse = runs[0][4].squeeze(-1).double()
    # Rows with no allowed key have lse -inf on both sides.
    result["lse_vs_single"] = torch.where(ring_lse == single_lse, 0.0, (ring_lse - single_lse).abs()).max().item()
    return result


def dropout():
    """The ring with dropout on ranks seeded apart, for 1 and 3 threads, against the single-process
    qkv.torch call seeded as rank 0 was: the ring takes rank 0's draw, and its keep-mask is keyed
    by global positions."""
    rank = dist.get_rank()
    rng = np.random.default_rng(8)
    q, k, v, dout = (torch.from_numpy(rng.standard_normal((2, 2, 29, 8), dtype=np.float32)) for _ in range(4))
    runs = []
    for threads in (1, 3):
        torch.manual_seed(100 + rank)
        leaves = [qt.shard(t).requires_grad_() for t in (q, k, v)]
        out = qt.ring_attention(*leaves, causal=True, dropout_p=0.3, num_threads=threads)
        out.backward(qt.shard(dout))
        runs.append([qt.unshard(t) for t in [out.detach()] + [x.grad for x in leaves]])
    torch.manual_seed(100)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    single = qt.scaled_dot_product_attention(*leaves, is_causal=True, dropout_p=0.3)
    single.backward(dout)
    want = [single.detach()] + [x.grad for x in leaves]
    no_drop = qt.scaled_dot_product_attention(q, k, v, is_causal=True)
    return {"bitwise": all(torch.equal(a, b) for a, b in zip(*runs)),
            "err": [(g - w).abs().max().item() for g, w in zip(runs[0], want)],
            "max": [w.abs().max().item() for w in want],
            "dropped": (runs[0][0] - no_drop).abs().max().item()}


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_SECONDS))
    torch.manual_seed(0)
    if mode == "check":
        results = [check(case) for case in json.loads(sys.argv[2])]
        if dist.get_rank() == 0:
            with open(sys.argv[3], "w") as f:
                json.dump(results, f)
    elif mode == "dropout":
        print(f"dropout result {json.dumps(dropout())}", flush=True)
    elif mode == "bad":
        q = torch.zeros(8, 4)
        try:
            qt.ring_attention(q, q, q, window=(1, 2) if dist.get_rank() == 0 else (1, 2.5))
        except ValueError as e:
            print(f"rank {dist.get_rank()} error: {e}", flush=True)
    elif mode == "lse_on_one_rank":  # rank 1's loss has a term on lse, rank 0's not
        x = torch.zeros(8, 4, requires_grad=True)
        out, lse = qt.ring_attention(x, x, x, return_lse=True)
        try:
            (out.sum() + (lse.sum() if dist.get_rank() == 1 else 0)).backward()
        except RuntimeError as e:
            print(f"rank {dist.get_rank()} error: {e}", flush=True)
    elif mode in ("fail", "hang", "fail_in_backward"):
        if dist.get_rank() == 1 and mode == "fail":
            raise SystemExit("rank 1 fails before the ring")
        if dist.get_rank() == 1 and mode == "hang":
            time.sleep(10 * TIMEOUT_SECONDS)
        try:
            x = torch.zeros(8, 4, requires_grad=True)
            out = qt.ring_attention(x, x, x)
            if dist.get_rank() == 1:
                raise SystemExit("rank 1 fails between the forward and the backward")
            out.sum().backward()
        except RuntimeError as e:
            print(f"rank 0 error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
