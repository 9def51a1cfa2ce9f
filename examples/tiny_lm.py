"""A small decoder-only language model trained with qkv.torch, beside the same model on PyTorch's
composite attention, then sampled with qkv.KVCache + qkv.decode_attention.

    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_lm.py                 # train both, compare
    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_lm.py --steps 20 --checkpoint lm.pt
    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_lm.py --resume lm.pt --steps 40

The text is WordNet's glosses (Debian's wordnet-base): "bank: sloping land (especially the slope
beside a body of water)" and the glosses' example sentences, one sequence each, bytes as tokens.
Each step packs whole sentences into about --tokens tokens: qkv takes them packed
(qkv.torch.varlen_attention with cu_seqlens, causal, attention dropout in the kernel), the
composite pads them to the longest sentence of the batch, masks and drops out as PyTorch code
does without a fused kernel. Positions are rotary and restart at each sentence.

The models start from the same weights and see the same batches, stepped in lockstep so the
machine's load falls on both alike. With --dropout 0 the two must agree to rounding. Dropout
draws different masks in the two (each model keeps its own torch generator), so their curves
differ by noise; --seeds K trains K models of each with dropout seeds seed..seed+K-1 and judges
the final held-out losses with Welch's t-test: the implementations differ by noise only if the
gap between their means is within the 95% band of the seed-to-seed spread. Held-out loss is measured without dropout every --eval-every steps.
"""

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import qkv
import qkv.torch

BOS, EOS, VOCAB = 2, 10, 128  # bytes as tokens: STX opens a sentence, "\n" ends it


# --- data -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def wordnet_sentences(root="/usr/share/wordnet", shortest=16, longest=200):
    """Every gloss of WordNet's data files as "lemma: definition", and each quoted example, in
    file order; ASCII only, shortest..longest characters. A tuple, read once per process."""
    files = [Path(root) / f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"WordNet's data files are missing ({', '.join(missing)}); "
                                "install Debian's wordnet-base or pass --wordnet DIR")
    out = []
    for f in files:
        for line in f.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # the licence header
            head, gloss = line.split(" | ", 1)
            lemma = head.split()[4].replace("_", " ")
            for i, part in enumerate(p.strip() for p in gloss.split(";")):
                text = part.strip('"').strip() if part.startswith('"') else f"{lemma}: {part}" if i == 0 else ""
                if shortest <= len(text) <= longest and text.isascii() and text.isprintable():
                    out.append(text)
    return tuple(out)


def split_sentences(sentences, held_out_every=50):
    """(train, held_out): every held_out_every-th sentence is held out."""
    held = [s for i, s in enumerate(sentences) if i % held_out_every == 0]
    return [s for i, s in enumerate(sentences) if i % held_out_every], held


def encode(text):
    return [BOS, *text.encode("ascii"), EOS]


def packed_batch(sentences, tokens, seed, step, held_out=False):
    """The batch of one step, a function of (seed, step, held_out) only, so a resumed run sees the
    batches an uninterrupted one would: sentences drawn at random until about `tokens` tokens, packed.
    Returns inputs [T], targets [T], cu_seqlens [B + 1] (int32) and the longest length."""
    rng = np.random.default_rng([seed, int(held_out), step])
    seqs, total = [], 0
    while total < tokens:
        ids = encode(sentences[rng.integers(len(sentences))])
        seqs.append(ids)
        total += len(ids) - 1
    x = torch.tensor([t for s in seqs for t in s[:-1]])
    y = torch.tensor([t for s in seqs for t in s[1:]])
    lengths = [len(s) - 1 for s in seqs]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    return x, y, cu, max(lengths)


# --- the model ------------------------------------------------------------------------------

def rotary_tables(positions, head_dim, theta=10000.0):
    """cos, sin [T, 1, head_dim / 2] of qkv's half_split rotary (angles in float64)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv[None, :]
    return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]


def rotate(x, cos, sin):
    """x [T, H, D] rotated as qkv.apply_rotary(layout="half_split") rotates it."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def positions_of(cu):
    """Each packed token's position inside its sentence, and its sentence's index."""
    lengths = (cu[1:] - cu[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return torch.arange(int(cu[-1])) - cu[:-1].long()[seq], seq


def padding(cu, longest):
    """The keys each padded row of a packed batch may see [B, 1, L, L] (causal, in its sentence),
    made once per batch for composite_attention."""
    lengths = (cu[1:] - cu[:-1]).long()
    col = torch.arange(longest)
    allowed = (col[None, :] <= col[:, None])[None] & (col[None, None, :] < lengths[:, None, None])
    return allowed[:, None]


def composite_attention(q, k, v, pad_layout, dropout_p):
    """Causal attention of packed q, k, v [T, H, D] as PyTorch code without a fused kernel does it:
    padded to [B, H, L, D], masked, softmax, dropout, back to packed rows. pad_layout: (pos, seq) of
    positions_of and padding()'s mask."""
    pos, seq, allowed = pad_layout
    batch, longest, heads, dim = allowed.shape[0], allowed.shape[-1], q.shape[1], q.shape[2]

    def pad(t):
        return t.new_zeros(batch, longest, heads, dim).index_put((seq, pos), t).transpose(1, 2)

    qp, kp, vp = pad(q), pad(k), pad(v)
    scores = qp @ kp.transpose(-1, -2) / dim ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = F.dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0)
    return (weights @ vp).transpose(1, 2)[seq, pos]


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def project(self, x, cos, sin):
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, self.heads, -1)).unbind(-3)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, x, attended):
        x = x + self.out(attended.flatten(-2))
        return x + self.mlp(self.ln2(x))


class TinyLM(torch.nn.Module):
    """Decoder-only: byte embedding, `layers` pre-norm blocks with rotary attention, a tied head.
    impl "qkv" attends with qkv.torch.varlen_attention, "torch" with composite_attention."""

    def __init__(self, d=128, heads=4, layers=2, dropout=0.1, impl="qkv"):
        super().__init__()
        self.impl, self.dropout, self.head_dim = impl, dropout, d // heads
        self.emb = torch.nn.Embedding(VOCAB, d)
        torch.nn.init.normal_(self.emb.weight, std=0.02)  # it is the output head too: start near uniform
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, tokens, cu, longest):
        p = self.dropout if self.training else 0.0
        pos, seq = positions_of(cu)
        cos, sin = rotary_tables(pos, self.head_dim)
        pad_layout = (pos, seq, padding(cu, longest)) if self.impl == "torch" else None
        x = self.emb(tokens)
        for b in self.blocks:
            q, k, v = b.project(x, cos, sin)
            if self.impl == "qkv":
                a = qkv.torch.varlen_attention(q, k, v, cu, cu, longest, longest, dropout_p=p, causal=True)
            else:
                a = composite_attention(q, k, v, pad_layout, p)
            x = b.finish(x, a)
        return self.ln(x) @ self.emb.weight.t()


# --- training -------------------------------------------------------------------------------

@contextlib.contextmanager
def own_generator(state):
    """Runs the body on a model's own torch generator state (a one-element list, updated), so
    models stepped in lockstep draw their dropout from separate, replayable streams."""
    outer = torch.get_rng_state()
    torch.set_rng_state(state[0])
    try:
        yield
    finally:
        state[0] = torch.get_rng_state()
        torch.set_rng_state(outer)


class Run:
    """One model, its optimizer, its dropout stream and its record."""

    def __init__(self, name, impl, args, init_state, dropout_seed):
        self.name = name
        self.model = TinyLM(args.d, args.heads, args.layers, args.dropout, impl)
        self.model.load_state_dict(init_state)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        self.rng = [torch.Generator().manual_seed(dropout_seed).get_state()]
        self.train_loss, self.eval_loss, self.step_seconds = [], [], []

    def step(self, batch):
        x, y, cu, longest = batch
        self.model.train()
        with own_generator(self.rng):
            start = time.perf_counter()
            loss = F.cross_entropy(self.model(x, cu, longest), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.step_seconds.append(time.perf_counter() - start)
        self.train_loss.append(loss.item())

    @torch.no_grad()
    def evaluate(self, batches):
        self.model.eval()
        losses = [F.cross_entropy(self.model(x, cu, n), y, reduction="sum").item() for x, y, cu, n in batches]
        return sum(losses) / sum(len(b[1]) for b in batches)

    def state(self):
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "rng": self.rng[0],
                "train_loss": self.train_loss, "eval_loss": self.eval_loss, "step_seconds": self.step_seconds}

    def load(self, s):
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["opt"])
        self.rng = [s["rng"]]
        self.train_loss, self.eval_loss, self.step_seconds = s["train_loss"], s["eval_loss"], s["step_seconds"]


def save_checkpoint(path, args, step, runs):
    """Written beside, then renamed over, so an interrupted save leaves the previous checkpoint."""
    tmp = f"{path}.tmp"
    torch.save({"args": vars(args), "step": step, "runs": {r.name: r.state() for r in runs}}, tmp)
    os.replace(tmp, path)


# --- generation -----------------------------------------------------------------------------

@torch.no_grad()
def generate(model, prompts, new_tokens, cache_kind, temperature=0.0, seed=0, page_tokens=16):
    """Samples new_tokens after each prompt, all prompts in one batch, token by token with a KV cache:
    cache_kind "qkv" keeps keys and values in one qkv.KVCache per layer (paged, one sequence per
    prompt) and attends with qkv.decode_attention; "torch" keeps them in preallocated tensors and
    attends with a matmul + softmax, as a PyTorch generation loop does. Prompts are prefilled
    token by token too, so every step is one decode step. temperature 0 = greedy. Returns the
    texts and the seconds spent."""
    model.eval()
    blocks, heads, dim = model.blocks, model.blocks[0].heads, model.head_dim
    batch, longest = len(prompts), max(len(p) for p in prompts) + 1 + new_tokens
    gen = torch.Generator().manual_seed(seed)
    tokens = [[BOS, *p.encode("ascii")] for p in prompts]
    if cache_kind == "qkv":
        pages = batch * -(-longest // page_tokens)
        caches = [qkv.KVCache(pages, page_tokens, heads, dim) for _ in blocks]
        seqs = [[c.create() for _ in prompts] for c in caches]
    else:
        kc = [torch.zeros(batch, heads, longest, dim) for _ in blocks]
        vc = [torch.zeros(batch, heads, longest, dim) for _ in blocks]
    start = time.perf_counter()
    feed = [t[0] for t in tokens]
    for t in range(longest - 1):
        pos = torch.full((batch,), t)
        cos, sin = rotary_tables(pos, dim)
        x = model.emb(torch.tensor(feed))
        for i, b in enumerate(blocks):
            q, k, v = b.project(x, cos, sin)  # [B, H, D] each
            if cache_kind == "qkv":
                for j, s in enumerate(seqs[i]):
                    caches[i].append(s, k[j:j + 1].numpy(), v[j:j + 1].numpy())
                a = torch.from_numpy(qkv.decode_attention(q[:, :, None].numpy(), caches[i], seqs[i]))[:, :, 0]
            else:
                kc[i][:, :, t], vc[i][:, :, t] = k, v
                w = (q[:, :, None] @ kc[i][:, :, :t + 1].transpose(-1, -2) / dim ** 0.5).softmax(-1)
                a = (w @ vc[i][:, :, :t + 1])[:, :, 0]
            x = b.finish(x, a)
        logits = model.ln(x) @ model.emb.weight.t()
        if temperature > 0:
            nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen)[:, 0]
        else:
            nxt = logits.argmax(-1)
        feed = []
        for j in range(batch):
            if t + 1 < len(tokens[j]):
                feed.append(tokens[j][t + 1])  # still in the prompt
            else:
                tokens[j].append(int(nxt[j]))
                feed.append(int(nxt[j]))
    seconds = time.perf_counter() - start
    texts = [bytes(t[1:]).decode("ascii", "replace").split("\n")[0] for t in tokens]
    return texts, seconds


# --- the command ----------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="training steps (in all, counting resumed ones)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per packed batch")
    p.add_argument("--d", type=int, default=128, help="model width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1, help="attention dropout")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1, help="weights, batches and the dropout of both models")
    p.add_argument("--seeds", type=int, default=1, help="dropout seeds per implementation (>= 2 judges the noise)")
    p.add_argument("--impl", choices=("both", "qkv", "torch"), default="both")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch and qkv threads (0 = torch's default)")
    p.add_argument("--generate", type=int, default=200, help="tokens to sample per prompt after training")
    p.add_argument("--prompts", default="bank: ;river: ;money: ;a large ;the bank ;she went to the ;he sat by the ;to ",
                   help="prompts to sample from, separated by ';'")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--checkpoint", help="save here every --eval-every steps and at the end")
    p.add_argument("--resume", help="continue from this checkpoint (its model settings win)")
    p.add_argument("--wordnet", default="/usr/share/wordnet")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    if args.d % args.heads or (args.d // args.heads) % 2:
        p.error(f"--d {args.d} must be a multiple of --heads {args.heads} with an even head size")
    if not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    for name in ("steps", "tokens", "eval_every", "eval_batches", "seeds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    resumed = None
    if args.resume:
        resumed = torch.load(args.resume)
        for key in ("tokens", "d", "heads", "layers", "dropout", "lr", "seed", "seeds", "impl", "eval_every",
                    "eval_batches"):
            setattr(args, key, resumed["args"][key])
    if args.threads:
        torch.set_num_threads(args.threads)
    train, held_out = split_sentences(wordnet_sentences(args.wordnet))
    eval_batches = [packed_batch(held_out, args.tokens, args.seed, i, held_out=True) for i in range(args.eval_batches)]
    torch.manual_seed(args.seed)
    init = TinyLM(args.d, args.heads, args.layers, args.dropout).state_dict()
    impls = ("qkv", "torch") if args.impl == "both" else (args.impl,)
    seeds = args.seeds if args.dropout > 0 else 1  # without dropout every seed trains the same model
    runs = [Run(impl if i == 0 else f"{impl}-{i}", impl, args, init, args.seed + i) for i in range(seeds)
            for impl in impls]
    first = 0
    if resumed:
        first = resumed["step"]
        for r in runs:
            r.load(resumed["runs"][r.name])
    params = sum(p.numel() for p in runs[0].model.parameters())
    print(f"tiny_lm: {len(train)} training sentences, {len(held_out)} held out; {params} parameters "
          f"(d {args.d}, {args.heads} heads, {args.layers} layers), {args.tokens} tokens per step, "
          f"attention dropout {args.dropout}, {torch.get_num_threads()} threads"
          + (f"; resumed at step {first}" if resumed else ""), flush=True)
    for step in range(first, args.steps):
        batch = packed_batch(train, args.tokens, args.seed, step)
        for r in runs:
            r.step(batch)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            for r in runs:
                r.eval_loss.append((step + 1, r.evaluate(eval_batches)))
            print(f"step {step + 1:5d}  " + "  ".join(
                f"{r.name}: train {r.train_loss[-1]:.4f} held-out {r.eval_loss[-1][1]:.4f}" for r in runs), flush=True)
            if args.checkpoint:
                save_checkpoint(args.checkpoint, args, step + 1, runs)
    report = {"args": vars(args), "runs": {}}
    for r in runs:
        timed = r.step_seconds[min(5, len(r.step_seconds) - 1):]  # the first steps warm the allocator
        report["runs"][r.name] = {"train_loss": r.train_loss, "eval_loss": r.eval_loss,
                                  "median_step_seconds": statistics.median(timed) if timed else None}
    by = {r.name: r for r in runs}
    if "qkv" in by and "torch" in by:
        report["comparison"] = compare(by, args)
    if args.generate:
        prompts = [p for p in args.prompts.split(";") if p]
        report["generation"] = {}
        for kind in ("qkv", "torch"):
            model = by.get("qkv", runs[0]).model
            texts, seconds = generate(model, prompts, args.generate, kind, args.temperature, args.seed)
            tokens = len(prompts) * (max(len(p) for p in prompts) + args.generate)
            report["generation"][kind] = {"tokens_per_second": tokens / seconds, "texts": texts}
            print(f"generation with the {kind} cache: {len(prompts)} prompts x {tokens // len(prompts)} steps, "
                  f"{tokens / seconds:.0f} tokens/s")
        for p, t in zip(prompts, report["generation"]["qkv"]["texts"]):
            print(f"  {t!r}")
    for r in runs:
        m = report["runs"][r.name]["median_step_seconds"]
        print(f"{r.name}: median step {1e3 * m:.1f} ms" if m else f"{r.name}: no timed steps")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


# Two-sided 95% points of Student's t by degrees of freedom (rounded down to a listed one).
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 10: 2.23, 15: 2.13, 20: 2.09, 30: 2.04}


def compare(by, args):
    """How far apart the qkv and composite curves are; with several dropout seeds, whether the gap
    between the implementations' final held-out losses is within their seed-to-seed noise."""
    gaps = [abs(x[1] - y[1]) for x, y in zip(by["qkv"].eval_loss, by["torch"].eval_loss)]
    out = {"qkv_vs_torch_max": max(gaps, default=0.0), "qkv_vs_torch_mean": statistics.mean(gaps or [0.0])}
    print(f"held-out loss, qkv vs composite (dropout seed {args.seed}): mean |diff| {out['qkv_vs_torch_mean']:.4f}, "
          f"max {out['qkv_vs_torch_max']:.4f}")
    final = {impl: [r.eval_loss[-1][1] for name, r in by.items() if name.split("-")[0] == impl]
             for impl in ("qkv", "torch")}
    if min(len(f) for f in final.values()) < 2:
        return out
    mean = {k: statistics.mean(v) for k, v in final.items()}
    var = {k: statistics.variance(v) / len(v) for k, v in final.items()}
    t = (mean["qkv"] - mean["torch"]) / max(sum(var.values()), 1e-30) ** 0.5
    df = sum(var.values()) ** 2 / max(sum(v * v / (len(final[k]) - 1) for k, v in var.items()), 1e-30)
    crit = T95[max(d for d in T95 if d <= max(df, 1))]
    out.update(final_held_out=final, welch_t=t, welch_df=df, t95=crit, within_noise=abs(t) <= crit)
    print(f"final held-out loss over {len(final['qkv'])} dropout seeds: qkv {mean['qkv']:.4f} "
          f"(sd {statistics.stdev(final['qkv']):.4f}), composite {mean['torch']:.4f} "
          f"(sd {statistics.stdev(final['torch']):.4f}); Welch t = {t:.2f}, df {df:.1f}, 95% band +-{crit}: "
          + ("the difference is within the dropout noise" if abs(t) <= crit else "the difference is NOT noise"))
    return out


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        print(f"tiny_lm: {e}", file=sys.stderr)
        sys.exit(1)
