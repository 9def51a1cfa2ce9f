"""Why the int8 KV cache keeps one scale per (token, head): the error of per-token scales against
one scale per page of 16 or 64 tokens, on synthetic keys (iid, varying token magnitudes, outlier
channels, outlier tokens). Prints relative RMS error of the dequantized keys and the largest logit
error for 16 random queries. `make bench` runs it; by hand: /usr/bin/python3 bench/int8_scale_accuracy.py"""
import numpy as np
rng = np.random.default_rng(0)
T, D = 4096, 128
def quant(x, group):  # one scale per `group` consecutive tokens (per head)
    xs = x.reshape(-1, group, D)
    s = np.abs(xs).max(axis=(1, 2), keepdims=True) / 127
    return (np.clip(np.rint(xs / s), -127, 127) * s).reshape(x.shape)
cases = {
  "iid normal": rng.standard_normal((T, D)),
  "token magnitudes lognormal(0,1)": rng.standard_normal((T, D)) * np.exp(rng.standard_normal((T, 1))),
  "4 outlier channels x10": rng.standard_normal((T, D)) * np.where(np.arange(D) < 4, 10, 1),
  "1% outlier tokens x20": rng.standard_normal((T, D)) * np.where(rng.random((T, 1)) < 0.01, 20, 1),
}
q = rng.standard_normal((16, D))
for name, k in cases.items():
    row = [name]
    for g in (1, 16, 64):
        e = quant(k, g) - k
        rel = np.sqrt((e ** 2).mean() / (k ** 2).mean())
        le = np.abs(q @ e.T).max() / np.sqrt(D)
        row.append(f"group {g}: rel rms {rel:.4f}, max logit err {le:.4f}")
    print(" | ".join(row))
