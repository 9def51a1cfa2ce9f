"""qkv.scaled_dot_product_attention against PyTorch (float64 oracle in py_oracle.py)."""

import platform

import numpy as np
import pytest
import torch

import qkv
from py_oracle import BASE_SEED, assert_close, random_case, rng_for, seed_note, torch_attention

FP32_TOL = 2e-5
FP64_TOL = 1e-12


def _run(q, k, v, mask, **kw):
    return qkv.scaled_dot_product_attention(q, k, v, return_lse=True, **mask, **kw)


def _check(q, k, v, mask, tol, note, **kw):
    out, lse = _run(q, k, v, mask, **kw)
    assert out.dtype == (np.float64 if q.dtype == np.float64 else np.float32), note
    assert out.shape == q.shape[:-1] + (v.shape[-1],), note
    assert lse.shape == q.shape[:-1], note
    want_out, want_lse = torch_attention(q, k, v, **mask)
    assert_close(out, want_out.numpy(), tol, f"out, {note}")
    assert_close(lse, want_lse.numpy(), tol, f"lse, {note}")


@pytest.mark.parametrize("case", range(300))
def test_random_parity_float32(case):
    q, k, v, mask, desc = random_case(rng_for(case), np.float32)
    _check(q, k, v, mask, FP32_TOL, f"{seed_note(case)} {desc}")


@pytest.mark.parametrize("case", range(300, 500))
def test_random_parity_float64(case):
    q, k, v, mask, desc = random_case(rng_for(case), np.float64)
    _check(q, k, v, mask, FP64_TOL, f"{seed_note(case)} {desc}")


# Each mask kind alone (and with GQA) on odd sizes, so no kind depends on the random draw above.
MASK_KINDS = {
    "none": lambda rng, B, H, N, M: {},
    "causal_top_left": lambda rng, B, H, N, M: {"causal": True},
    "causal_bottom_right": lambda rng, B, H, N, M: {"causal": True, "causal_align": "bottom_right",
                                                    "key_lengths": [M, max(M - 2, 0)][:B],
                                                    "query_lengths": [N, max(N - 1, 0)][:B]},
    "key_lengths": lambda rng, B, H, N, M: {"key_lengths": [int(x) for x in rng.integers(0, M + 1, B)]},
    "query_lengths": lambda rng, B, H, N, M: {"query_lengths": [int(x) for x in rng.integers(0, N + 1, B)]},
    "window": lambda rng, B, H, N, M: {"window": (2, 1)},
    "window_left_only_bottom_right": lambda rng, B, H, N, M: {"window": (3, None), "causal_align": "bottom_right"},
    "keep_mask": lambda rng, B, H, N, M: {"keep_mask": rng.random((B, H, N, M)) < 0.5},
    "keep_mask_broadcast": lambda rng, B, H, N, M: {"keep_mask": rng.random((N, 1)) < 0.8},
    "bias": lambda rng, B, H, N, M: {"bias": rng.standard_normal((B, H, N, M)).astype(np.float32)},
    "bias_float64_broadcast": lambda rng, B, H, N, M: {"bias": rng.standard_normal((1, M))},
    "alibi": lambda rng, B, H, N, M: {"alibi_slopes": [float(x) for x in rng.uniform(0.05, 1.0, H)]},
    "alibi_causal_bottom_right": lambda rng, B, H, N, M: {"alibi_slopes": [0.5] * H, "causal": True,
                                                          "causal_align": "bottom_right"},
    "softcap": lambda rng, B, H, N, M: {"softcap": 0.7, "scale": 2.0},
    "softcap_bias_alibi": lambda rng, B, H, N, M: {"softcap": 1.5, "alibi_slopes": [0.25] * H,
                                                   "bias": rng.standard_normal((N, M)).astype(np.float32)},
    "everything": lambda rng, B, H, N, M: {"causal": True, "window": (4, None), "key_lengths": [M, M // 2][:B],
                                           "keep_mask": rng.random((N, M)) < 0.9, "softcap": 5.0,
                                           "bias": rng.standard_normal((N, M)).astype(np.float32),
                                           "alibi_slopes": [0.1] * H},
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("kind", sorted(MASK_KINDS))
def test_each_mask_kind(kind, gqa, dtype):
    case = 1000 + sorted(MASK_KINDS).index(kind) * 4 + 2 * gqa + (dtype == np.float64)
    rng = rng_for(case)
    B, Hkv, N, M, D = 2, 2, 17, 65, 3
    H = 4 if gqa else Hkv
    q = rng.standard_normal((B, H, N, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, M, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, M, 59)).astype(dtype)
    mask = MASK_KINDS[kind](rng, B, H, N, M)
    _check(q, k, v, mask, FP32_TOL if dtype == np.float32 else FP64_TOL, f"{seed_note(case)} {kind} gqa={gqa}")


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    rng = rng_for(2000)
    q = rng.standard_normal((2, 1, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 1, 7, 4)).astype(np.float32)
    v = rng.standard_normal((2, 1, 7, 6)).astype(np.float32)
    keep = np.ones((5, 7), dtype=bool)
    keep[1] = False  # row 1 of every batch: no key at all
    out, lse = qkv.scaled_dot_product_attention(q, k, v, keep_mask=keep, query_lengths=[5, 3], key_lengths=[7, 0],
                                                return_lse=True)
    assert np.all(out[:, :, 1] == 0) and np.all(np.isneginf(lse[:, :, 1])), seed_note(2000)
    assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1])), seed_note(2000)  # key_lengths 0
    assert not np.isnan(out).any(), seed_note(2000)
    assert np.all(np.isfinite(lse[0, 0, [0, 2, 3, 4]])), seed_note(2000)


@pytest.mark.parametrize("kernel", ["auto", "reference", "fused"])
def test_kernels_and_threads_agree(kernel):
    rng = rng_for(2100)
    q = rng.standard_normal((2, 4, 65, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 64, 64)).astype(np.float32)
    v = rng.standard_normal((2, 2, 64, 40)).astype(np.float32)
    one = qkv.scaled_dot_product_attention(q, k, v, causal=True, kernel=kernel, num_threads=1)
    two = qkv.scaled_dot_product_attention(q, k, v, causal=True, kernel=kernel, num_threads=2)
    assert np.array_equal(one, two), f"results differ between 1 and 2 threads ({seed_note(2100)})"
    want, _ = torch_attention(q, k, v, causal=True)
    assert_close(one, want.numpy(), FP32_TOL, f"kernel={kernel} {seed_note(2100)}")


def test_strided_views_are_read_in_place():
    # Views that are not C-contiguous are accepted (documented): the [B, N, H, D] layout
    # transposed to [B, H, N, D], every other row, a reversed head dim.
    rng = rng_for(2200)
    qb = rng.standard_normal((2, 9, 3, 40)).astype(np.float32)
    kb = rng.standard_normal((2, 18, 3, 40)).astype(np.float32)
    vb = rng.standard_normal((2, 18, 3, 7)).astype(np.float32)
    q = qb.transpose(0, 2, 1, 3)
    k = kb.transpose(0, 2, 1, 3)[:, :, ::2]
    v = vb.transpose(0, 2, 1, 3)[:, :, ::2, ::-1]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous)
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)
    want = qkv.scaled_dot_product_attention(*(np.ascontiguousarray(a) for a in (q, k, v)), causal=True)
    assert np.array_equal(out, want), seed_note(2200)
    ref, _ = torch_attention(q, k, v, causal=True)
    assert_close(out, ref.numpy(), FP32_TOL, seed_note(2200))


def test_broadcast_view_of_k_and_v():
    rng = rng_for(2300)
    q = rng.standard_normal((3, 5, 8)).astype(np.float32)
    kv = rng.standard_normal((1, 6, 8)).astype(np.float32)
    k = np.broadcast_to(kv, (3, 6, 8))  # stride 0 over heads
    out = qkv.scaled_dot_product_attention(q, k, k)
    ref, _ = torch_attention(q, np.ascontiguousarray(k), np.ascontiguousarray(k))
    assert_close(out, ref.numpy()[0], FP32_TOL, seed_note(2300))


def test_float64_broadcast_inputs_are_rounded_once_per_distinct_element():
    """Arrays taken as float32 (a bias, varlen's q, k, v) round float64 into a copy; a broadcast
    view (stride 0) was copied at its full size, so a 16 KB bias broadcast over 2048 x 2048 took
    16 MB, and a view over 2**36 rows hung. Only the distinct elements are rounded now, and the
    results equal those of the same view in float32."""
    import tracemalloc
    rng = rng_for(2310)
    q, k = (rng.standard_normal((2048, 8)).astype(np.float32) for _ in range(2))
    bias_row = rng.standard_normal((1, 2048))
    want = qkv.scaled_dot_product_attention(q, k, k, bias=np.broadcast_to(bias_row.astype(np.float32), (2048, 2048)))
    tracemalloc.start()
    out = qkv.scaled_dot_product_attention(q, k, k, bias=np.broadcast_to(bias_row, (2048, 2048)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(out, want), seed_note(2310)
    assert peak < 2 << 20, f"{peak} bytes allocated: the broadcast float64 bias was copied whole"
    huge = np.broadcast_to(np.ones((1, 4, 8)), (2**36, 4, 8))
    with pytest.raises(MemoryError):
        qkv.varlen_attention(huge, huge, huge, [0, 2**36], [0, 2**36])


def _to_bf16_bits(x):
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def _from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


# With AVX512_BF16 the kernel rounds the softmax weights to bf16 for P·V (relative 2^-9 each);
# measured here about 9e-4 · (1 + max|ref|) at worst, so 4e-3 leaves a margin. Other paths
# widen exactly and meet the fp32 tolerance.
BF16_TOL = 4e-3


def _simd_paths():
    paths = []
    for name in ("avx512", "avx2", "neon", "scalar"):
        try:
            paths.append(qkv.simd_path(name))
        except ValueError:
            pass
    return paths


@pytest.mark.parametrize("simd", _simd_paths())
@pytest.mark.parametrize("shape, mask", [((2, 17, 59), {"causal": True}), ((3, 64, 40), {"window": (5, 5)}),
                                         ((1, 65, 111), {"key_lengths": 33}), ((2, 2, 3, 1), {})])
def test_bfloat16_bits(simd, shape, mask):
    case = 2400 + shape[-1]
    rng = rng_for(case)
    q, k, v = (_to_bf16_bits(rng.standard_normal(shape)) for _ in range(3))
    out = qkv.scaled_dot_product_attention(q, k, v, simd=simd, **mask)
    assert out.dtype == np.float32 and out.shape == shape
    ref, _ = torch_attention(_from_bf16_bits(q), _from_bf16_bits(k), _from_bf16_bits(v), **mask)
    tol = BF16_TOL if simd == "avx512" else FP32_TOL
    assert_close(out, ref.numpy().reshape(shape), tol, f"{seed_note(case)} simd={simd}")


@pytest.mark.parametrize("simd", _simd_paths())
def test_every_simd_path_matches_torch(simd):
    assert qkv.simd_path(simd) == simd
    for case in range(2450, 2470):
        q, k, v, mask, desc = random_case(rng_for(case), np.float32)
        out = qkv.scaled_dot_product_attention(q, k, v, simd=simd, **mask)
        want, _ = torch_attention(q, k, v, **mask)
        assert_close(out, want.numpy(), FP32_TOL, f"{seed_note(case)} simd={simd} {desc}")


def test_unknown_simd_is_refused():
    with pytest.raises(ValueError, match="simd must be 'auto', 'avx512', 'avx2', 'neon' or 'scalar', got 'sse9'"):
        qkv.scaled_dot_product_attention(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32),
                                         np.ones((2, 2), np.float32), simd="sse9")


@pytest.mark.skipif(platform.machine() in ("aarch64", "arm64"), reason="NEON runs here")
def test_neon_is_refused_off_arm():
    with pytest.raises(ValueError, match="SIMD path neon was requested but this CPU does not support it"):
        qkv.scaled_dot_product_attention(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32),
                                         np.ones((2, 2), np.float32), simd="neon")


def test_matches_torch_formula_directly_in_float32():
    # The literal oracle: torch.softmax(q @ k^T * scale + mask) @ v, computed by torch in fp32.
    rng = rng_for(2500)
    q = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    k = rng.standard_normal((2, 3, 65, 64)).astype(np.float32)
    v = rng.standard_normal((2, 3, 65, 64)).astype(np.float32)
    add = np.where(np.tril(np.ones((64, 65), dtype=bool)), 0.0, -np.inf).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    want = torch.softmax(tq @ tk.transpose(-1, -2) * 0.125 + torch.from_numpy(add), dim=-1) @ tv
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)
    assert_close(out, want.numpy(), FP32_TOL, seed_note(2500))


def test_scale_and_scalar_lengths():
    rng = rng_for(2600)
    q = rng.standard_normal((2, 2, 3, 5))
    k = rng.standard_normal((2, 1, 17, 5))
    v = rng.standard_normal((2, 1, 17, 3))
    out = qkv.scaled_dot_product_attention(q, k, v, scale=0.3, key_lengths=np.int64(11), query_lengths=(3, 2))
    ref, _ = torch_attention(q, k, v, scale=0.3, key_lengths=11, query_lengths=(3, 2))
    assert_close(out, ref.numpy(), FP64_TOL, seed_note(2600))


def test_empty_query_and_key_lengths_dims():
    rng = rng_for(2700)
    q = rng.standard_normal((0, 4)).astype(np.float32)
    k = rng.standard_normal((3, 4)).astype(np.float32)
    assert qkv.scaled_dot_product_attention(q, k, k).shape == (0, 4)
    out, lse = qkv.scaled_dot_product_attention(k, q, np.zeros((0, 2), np.float32), return_lse=True)
    assert out.shape == (3, 2) and np.all(out == 0) and np.all(np.isneginf(lse))


def test_docstrings():
    assert "PyTorch" in qkv.scaled_dot_product_attention.__doc__
    assert "keep_mask" in qkv.scaled_dot_product_attention.__doc__
    assert qkv.default_num_threads() >= 1
    assert BASE_SEED > 0


def test_lse_float64_is_the_number_the_float32_lse_rounds():
    """return_lse="float64" gives the kernel's m + log(l) unrounded; True gives it rounded once to
    float32 (the fp32 result), for float32 and bfloat16 inputs; anything else is refused."""
    rng = rng_for(2100)
    # Scores of a few units: every row's l = sum exp(s - m) is then far from 1, so log(l) has bits
    # below fp32 (at q*50 a row can be one-hot, with l = 1 and lse = m exactly in both forms).
    q, k, v = (rng.standard_normal((2, 3, 17, 40)).astype(np.float32) * 2 for _ in range(3))
    for arrays in ((q, k, v), tuple((a.view(np.uint32) >> 16).astype(np.uint16) for a in (q, k, v))):
        _, lse32 = qkv.scaled_dot_product_attention(*arrays, causal=True, return_lse=True)
        _, lse64 = qkv.scaled_dot_product_attention(*arrays, causal=True, return_lse="float64")
        assert lse32.dtype == np.float32 and lse64.dtype == np.float64, seed_note(2100)
        assert np.array_equal(lse64.astype(np.float32), lse32), seed_note(2100)
        assert np.any(lse64 != lse32.astype(np.float64)), seed_note(2100)  # bits below fp32 are kept
    with pytest.raises(ValueError, match="return_lse must be False, True or"):
        qkv.scaled_dot_product_attention(q, k, v, return_lse="float16")
