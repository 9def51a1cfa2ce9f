"""Sequence-parallel ring attention over a torch.distributed process group, with autograd.

The plan and per-step kernels are the MPI ring's (qkv.distributed, src/distributed/ring_plan.h):
each rank holds a shard of the sequence ("zigzag": chunks r and 2P-1-r of 2P, which balances a
causal mask), the K/V shards travel the ring by isend/irecv while the rank attends its queries to
the shard at hand, and partial results merge by log-sum-exp in ring order. The backward sends
each shard's dK/dV sum along with it. For a fixed number of ranks the results are bitwise the same
for any num_threads.

Messages use their own tags on the caller's group; a group used for other point-to-point traffic
at the same time must not use tags 0x4b56-0x4b57 or 0x6447-0x6448.
"""

import torch
import torch.distributed as dist

from . import _qkv
from ._ring import as4, options, place_shards, shard_ranges
# qkv.torch's own checks of tensor arguments and refusals in backward, from the leaf module, which
# (unlike qkv.torch, which imports this module) can be imported here at the top.
from ._torch_checks import (_check_tensor, _dropout_seed, _first_order_only, _lse_gradient_message, _scalar, _uses_lse,
                            _vector_arg)

_TAG_K, _TAG_V, _TAG_DK, _TAG_DV = 0x4b56, 0x4b57, 0x6447, 0x6448


def _global_rank(group, rank):
    if group is None or group is dist.GroupMember.WORLD:
        return rank
    return dist.distributed_c10d._get_global_rank(group, rank)


class _Ring:
    """One rank's place in the ring: its neighbours and every rank's agreed row."""

    def __init__(self, group, table):
        self.group, self.table = group, table
        self.ranks, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.left = _global_rank(group, (self.rank - 1) % self.ranks)
        self.right = _global_rank(group, (self.rank + 1) % self.ranks)

    def kv_shapes(self, r):
        """The shapes of rank r's k and v shards."""
        return _qkv._ring_kv_shapes(self.table, r)

    def post(self, tensors, tags, recv_shapes, what, step):
        """Sends tensors to the right and receives tensors of recv_shapes from the left, one tag
        each; returns a _Pending whose wait() gives the received tensors."""
        sends = [dist.isend(t, self.right, group=self.group, tag=tag) for t, tag in zip(tensors, tags)]
        got = [torch.empty(s, dtype=torch.float32) for s in recv_shapes]
        recvs = [dist.irecv(t, self.left, group=self.group, tag=tag) for t, tag in zip(got, tags)]
        return _Pending(self, sends, recvs, tensors, got, what, step)


class _Pending:
    """The transfers of one ring step in flight (`sent` keeps the sent tensors alive until then)."""

    def __init__(self, ring, sends, recvs, sent, got, what, step):
        self.ring, self.sends, self.recvs, self.sent, self.got = ring, sends, recvs, sent, got
        self.what, self.step = what, step

    def wait(self):
        r = self.ring
        for works, peer, verb in ((self.recvs, r.left, "receiving"), (self.sends, r.right, "sending")):
            for w in works:
                try:
                    w.wait()
                except RuntimeError as e:
                    raise RuntimeError(
                        f"qkv.torch.ring_attention: rank {r.rank}: {verb} {self.what} at ring step {self.step} "
                        f"{'from' if verb == 'receiving' else 'to'} global rank {peer} failed; a rank of the group "
                        f"failed, stopped calling the ring, or exceeded the group's timeout: {e}") from e
        return self.got


def _agree(group, local, seed):
    """(every rank's row of the agreement, rank 0's dropout seed), or the same ValueError on every
    rank when any rank's arguments were bad (`local` is this rank's row or its error message)."""
    rows = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(rows, local if isinstance(local, str) else (local, seed), group=group)
    except RuntimeError as e:
        raise RuntimeError(f"qkv.torch.ring_attention: rank {dist.get_rank(group)}: the ranks could not agree on the "
                           f"call (a rank of the group failed, did not call ring_attention, or exceeded the group's "
                           f"timeout): {e}") from e
    for r, row in enumerate(rows):
        if isinstance(row, str):
            raise ValueError(f"qkv.torch.ring_attention: rank {r}: {row}")
    return [int(x) for row, _ in rows for x in row], rows[0][1]


def _refuse_lse_gradient_together(ring, dlse):
    """A loss term on lse on any rank raises on every rank, before any transfer: the backward is a
    collective, and refused on that rank alone it left the others waiting until the group's timeout."""
    uses = [torch.zeros(1, dtype=torch.int32) for _ in range(ring.ranks)]
    try:
        dist.all_gather(uses, torch.tensor([int(_uses_lse(dlse))], dtype=torch.int32), group=ring.group)
    except RuntimeError as e:
        raise RuntimeError(f"qkv.torch.ring_attention: rank {ring.rank}: the ranks could not agree on the backward (a "
                           f"rank of the group failed, did not call backward, or exceeded the group's timeout): "
                           f"{e}") from e
    users = [r for r, u in enumerate(uses) if u.item()]
    if users:
        raise RuntimeError(_lse_gradient_message(f"ring_attention: rank {', '.join(map(str, users))}"))


def _forward(ring, q, k, v, opts):
    steps = _qkv._RingForward.start(ring.table, ring.ranks, ring.rank, q.detach().numpy(), opts)
    kv = (k.detach(), v.detach())
    for s in range(ring.ranks):
        src, nxt = (ring.rank - s) % ring.ranks, (ring.rank - s - 1) % ring.ranks
        pending = ring.post(kv, (_TAG_K, _TAG_V), ring.kv_shapes(nxt), "a K/V shard", s) if s + 1 < ring.ranks else None
        steps.step(src, kv[0].numpy(), kv[1].numpy())
        if pending is not None:
            kv = pending.wait()
    out, lse = steps.finish()
    return torch.from_numpy(out), torch.from_numpy(lse)


def _backward(ring, dout, q, k, v, out, lse, opts):
    P, r = ring.ranks, ring.rank
    steps = _qkv._RingBackward.start(ring.table, P, r, dout.numpy(), q.detach().numpy(), out.numpy(), lse.numpy(),
                                     opts)
    kv = (k.detach(), v.detach())
    grads = None  # the dK/dV sums in flight
    for s in range(P):
        src, nxt = (r - s) % P, (r - s - 1) % P
        kv_next = ring.post(kv, (_TAG_K, _TAG_V), ring.kv_shapes(nxt), "a K/V shard", s) if s + 1 < P else None
        local = [torch.from_numpy(g) for g in steps.step(src, kv[0].numpy(), kv[1].numpy())]
        if P > 1:
            # The sum for src so far (ranks src .. r-1) plus this rank's part, in that order, as the
            # MPI ring adds them; after the last hop each rank holds its own shard's dK/dV.
            if s > 0:
                local = [acc.add_(g) for acc, g in zip(grads.wait(), local)]
            grads = ring.post(local, (_TAG_DK, _TAG_DV), ring.kv_shapes(r if s + 1 == P else nxt), "a dK/dV sum", s)
        if kv_next is not None:
            kv = kv_next.wait()
    dq = torch.from_numpy(steps.finish())
    dk, dv = grads.wait() if P > 1 else local
    return dq, dk, dv


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, opts):
        out, lse = _forward(ring, q, k, v, opts)
        ctx.set_materialize_grads(False)
        ctx.ring, ctx.opts = ring, opts
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        _refuse_lse_gradient_together(ctx.ring, dlse)
        with torch.no_grad():
            if dout is None:
                dout = torch.zeros_like(out)
            dq, dk, dv = _backward(ctx.ring, dout.float().contiguous(), q, k, v, out, lse, ctx.opts)
        return _first_order_only((dq, dk, dv, None, None), (q, k, v, dout, dlse), "ring_attention")


def _local(q, k, v, make_options):
    """This rank's (row of the agreement, [B, H, n, D] float32 views, options), or the message of
    its first bad argument (then views and options are None)."""
    try:
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            _check_tensor(t, name)
            if t.dtype != torch.float32:
                raise TypeError(f"{name}: dtype {t.dtype} is not supported by the ring (float32 kernels); pass "
                                f"{name}.float()")
        views = [as4(t, name).contiguous() for t, name in ((q, "q"), (k, "k"), (v, "v"))]
        opts = make_options()
        return _qkv._ring_row(*(t.detach().numpy() for t in views), opts), views, opts
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}", None, None


def ring_attention(q, k, v, group=None, *, causal=False, causal_align="top_left", window=None, key_lengths=None,
                   query_lengths=None, alibi_slopes=None, softcap=None, scale=None, sharding="zigzag",
                   num_threads=None, return_lse=False, dropout_p=0.0):
    """Attention of this rank's queries over the whole (sharded) key sequence of the ranks of
    `group` (default: the world), with autograd. A collective: every rank of the group calls it,
    and later calls backward through its result, together.

    q [..., n, D], k [..., m, D], v [..., m, Dv]: this rank's shards (shard()), float32 CPU tensors of
    rank 2, 3 or 4 ([n, D], [H, n, D], [B, H, n, D]); k and v may have fewer heads (GQA). Masks and
    options as in qkv.distributed.ring_attention, in GLOBAL positions: causal (causal_align),
    window, key_lengths, query_lengths, alibi_slopes, softcap, scale, sharding ("zigzag" or
    "contiguous"). num_threads: default torch.get_num_threads().
    dropout_p: attention dropout in qkv's kernels, the keep-mask of qkv.torch's
    scaled_dot_product_attention on the whole sequence. Every rank draws a seed from torch's default
    generator and the ring uses rank 0's, so ranks seeded alike or not drop one mask, and
    torch.manual_seed(s) on rank 0 replays it. Pass 0.0 at eval.

    Returns out [..., n, Dv], or (out, lse) with lse [..., n] if return_lse; a loss term on lse
    raises RuntimeError in backward (the ring computes no lse gradient: use lse.detach()), as does
    differentiating the gradients (create_graph=True).
    A bad argument on any rank raises the same ValueError on every rank; a rank that fails or stops
    during the ring makes the others raise RuntimeError naming the transfer, at the latest after the
    group's timeout (init_process_group(timeout=...)).
    """
    if num_threads is None:
        num_threads = torch.get_num_threads()

    def p():
        return _qkv._dropout_p_arg(_scalar(dropout_p))

    def make_options(seed=0):
        return options(causal, causal_align, window, _vector_arg(key_lengths, "key_lengths", True),
                       _vector_arg(query_lengths, "query_lengths", True),
                       _vector_arg(alibi_slopes, "alibi_slopes", False), softcap, scale, num_threads, sharding,
                       p(), seed if p() > 0.0 else None)

    # The rows agree on dropout_p with a stand-in seed; the call then takes rank 0's draw (drawn, as
    # by qkv.torch's other front ends, only when dropout drops anything).
    row, views, opts = _local(q, k, v, make_options)
    dropping = opts is not None and p() > 0.0
    table, seed = _agree(group, row, _dropout_seed() if dropping else 0)
    if dropping:
        opts = make_options(seed)
    out, lse = _RingFunction.apply(*views, _Ring(group, table), opts)
    out = out.reshape(*q.shape[:-1], out.size(-1))
    return (out, lse.reshape(q.shape[:-1])) if return_lse else out


def shard(x, group=None, sharding="zigzag"):
    """This rank's tokens (dim -2) of a whole sequence x [..., L, C] (differentiable: a gather)."""
    ranges = shard_ranges(x.size(-2), dist.get_world_size(group), dist.get_rank(group), sharding)
    return torch.cat([x[..., b:e, :] for b, e in ranges], dim=-2)


def unshard(x, group=None, sharding="zigzag"):
    """The whole sequence, on every rank, from each rank's shard x [..., n, C] (not differentiable)."""
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, x.detach(), group=group)
    length = sum(p.size(-2) for p in parts)
    return place_shards(x.new_empty(*x.shape[:-2], length, x.size(-1)), parts, sharding)
