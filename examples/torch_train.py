"""Train a small character-level transformer LM on CPU with PyTorch, its attention either
torch.nn.MultiheadAttention or qkv.torch.MultiheadAttention (the same module, the same weights),
and measure the step time and the peak memory of each.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py               # both, compared
    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py --impl qkv    # one of them
    PYTHONPATH=build/python /usr/bin/python3 examples/torch_train.py --attention-only  # attention alone

The text is a file Debian ships (/usr/share/common-licenses/GPL-3 by default). Each implementation
runs in its own process (so peak resident memory, ru_maxrss, is its own), from the same seed, on the
same batches; a step is forward + backward + AdamW. The printed step time is the median of the
timed steps after the warm-up ones.
"""

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads, attention_class):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = attention_class(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x, causal_mask, is_qkv):
        h = self.ln1(x)
        # Both get PyTorch's causal attn_mask; qkv also gets the is_causal hint (torch 1.13 lacks it).
        extra = dict(is_causal=True) if is_qkv else {}
        x = x + self.attn(h, h, h, attn_mask=causal_mask, need_weights=False, **extra)[0]
        return x + self.mlp(self.ln2(x))


class CharLM(torch.nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, attention_class):
        super().__init__()
        self.is_qkv = attention_class is not torch.nn.MultiheadAttention
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, attention_class) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -math.inf), diagonal=1))

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x, self.mask, self.is_qkv)
        return self.head(x)


def run(args):
    torch.set_num_threads(args.threads)
    attention = torch.nn.MultiheadAttention
    if args.impl == "qkv":
        import qkv.torch
        attention = qkv.torch.MultiheadAttention
    text = open(args.text, "rb").read()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(0)
    model = CharLM(len(vocab), args.d_model, args.heads, args.layers, args.seq, attention)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        start = torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s:s + args.seq] for s in start])
        y = torch.stack([data[s + 1:s + args.seq + 1] for s in start])
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if step >= args.warmup:
            times.append(t1 - t0)
        losses.append(loss.item())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(impl=args.impl, step_ms=1e3 * statistics.median(times), step_ms_min=1e3 * min(times),
                peak_rss_mb=peak / 1024, rss_before_mb=rss_before / 1024, first_loss=losses[0],
                last_loss=statistics.mean(losses[-5:]))


def attention_only(args):
    """Median forward and backward times of the attention alone, causal, on [batch, heads, seq, d/heads]."""
    import qkv.torch
    torch.set_num_threads(args.threads)
    shape = (args.batch, args.heads, args.seq, args.d_model // args.heads)
    mask = torch.triu(torch.full((args.seq, args.seq), -math.inf), diagonal=1)

    def composite(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v

    def fused(q, k, v):
        return qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)

    for name, fn in (("qkv", fused), ("torch", composite)):
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        fwd, bwd = [], []
        for _ in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            out = fn(q, k, v)
            t1 = time.perf_counter()
            out.backward(torch.ones_like(out))
            fwd.append(t1 - t0)
            bwd.append(time.perf_counter() - t1)
        f, b = (1e3 * statistics.median(x[args.warmup:]) for x in (fwd, bwd))
        print(f"{name:6s} attention {list(shape)} causal: forward {f:.1f} ms, backward {b:.1f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["torch", "qkv", "both"], default="both")
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="with --impl both: alternate the two this many times")
    p.add_argument("--attention-only", action="store_true", help="time the attention alone (forward, backward)")
    args = p.parse_args()
    if args.attention_only:
        attention_only(args)
        return
    if args.impl != "both":
        print(json.dumps(run(args)))
        return
    results = {"torch": [], "qkv": []}
    for _ in range(args.repeats):
        for impl in ("torch", "qkv"):
            cmd = [sys.executable, __file__, "--impl", impl]
            for name, value in vars(args).items():
                if name not in ("impl", "repeats", "attention_only"):
                    cmd += [f"--{name.replace('_', '-')}", str(value)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            results[impl].append(r)
            print(json.dumps(r), flush=True)
    med = {impl: statistics.median(r["step_ms"] for r in rs) for impl, rs in results.items()}
    peak = {impl: statistics.median(r["peak_rss_mb"] for r in rs) for impl, rs in results.items()}
    grow = {impl: statistics.median(r["peak_rss_mb"] - r["rss_before_mb"] for r in rs) for impl, rs in results.items()}
    print(f"seq {args.seq} batch {args.batch} d_model {args.d_model} heads {args.heads} layers {args.layers} "
          f"threads {args.threads}")
    for impl in ("torch", "qkv"):
        print(f"{impl:6s} step {med[impl]:8.1f} ms  peak RSS {peak[impl]:7.0f} MB (+{grow[impl]:.0f} MB in training)  "
              f"loss {results[impl][-1]['first_loss']:.3f} -> {results[impl][-1]['last_loss']:.3f}")
    print(f"speed-up {med['torch'] / med['qkv']:.2f}x (medians of {args.repeats} alternated runs), "
          f"training memory ratio {grow['torch'] / grow['qkv']:.2f}x")


if __name__ == "__main__":
    main()
