"""What the fp32 backwards (qkv.attention_backward, qkv.varlen_attention_backward) make of an lse
that is not the forward's: NaN and +inf are refused naming the row (they gave NaN gradients
silently), a finite one that overflows the gradients is named as the cause (it was blamed on q,
k, v and dout, with a kernel="reference" that varlen does not take), while the forward's own -inf
for a row with no allowed key, and its NaN from a NaN input, still round-trip."""
import numpy as np
import pytest

import qkv

CU = [0, 3, 6]


VARLEN_REMEDY = ("scale the inputs down (the float64 reference kernel is Kernel::reference in C++; Python's varlen "
                 "has no kernel choice)")


def _varlen_case():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((6, 2, 4), dtype=np.float32)
    out, lse = qkv.varlen_attention(q, q, q, CU, CU, return_lse=True)
    return q, out, lse


def _dense_case():
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 2, 3, 4), dtype=np.float32)
    out, lse = qkv.scaled_dot_product_attention(q, q, q, return_lse="float64")
    return q, out, lse


@pytest.mark.parametrize("value, word", [(np.nan, "NaN"), (np.inf, r"\+inf")])
def test_nan_or_inf_lse_is_refused_naming_the_row(value, word):
    tail = (r" although q, k and v are finite; no forward gives that \(a row's lse is finite, or -inf when the row "
            r"has no allowed key\): pass the lse that the forward returned with out")
    q, out, lse = _varlen_case()
    lse[1, 4] = value
    with pytest.raises(ValueError, match=r"^varlen_attention_backward: lse\[1, 4\] \(head, packed query row\) is "
                                         + word + tail + "$"):
        qkv.varlen_attention_backward(q, q, q, q, out, lse, CU, CU)
    q, out, lse = _dense_case()
    lse[0, 1, 2] = value
    with pytest.raises(ValueError, match=r"^attention_backward: lse\[0, 1, 2\] \(batch, head, query row\) is "
                                         + word + tail + "$"):
        qkv.attention_backward(q, q, q, q, out=out, lse=lse)


def test_the_forwards_minus_inf_and_nan_round_trip():
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 3, 4), dtype=np.float32)
    keep = np.ones((3, 3), bool)
    keep[1] = False  # row 1 has no allowed key: its lse is -inf
    out, lse = qkv.scaled_dot_product_attention(q, q, q, keep_mask=keep, return_lse="float64")
    assert np.isneginf(lse[..., 1]).all()
    dq, dk, dv = qkv.attention_backward(q, q, q, q, out=out, lse=lse, keep_mask=keep)
    assert all(np.isfinite(g).all() for g in (dq, dk, dv)) and not dq[..., 1, :].any()
    packed = q[0].transpose(1, 0, 2).copy()  # [3, 2, 4]; sequence 0 has a query and no key
    out, lse = qkv.varlen_attention(packed, packed, packed, [0, 1, 3], [0, 0, 3], return_lse=True)
    assert np.isneginf(lse[:, 0]).all()
    grads = qkv.varlen_attention_backward(packed, packed, packed, packed, out, lse, [0, 1, 3], [0, 0, 3])
    assert all(np.isfinite(g).all() for g in grads) and not grads[0][0].any()
    q[0, 0, 0, 0] = np.nan  # a NaN input's NaN lse is the forward's own: NaN gradients, no error
    out, lse = qkv.scaled_dot_product_attention(q, q, q, return_lse="float64")
    assert np.isnan(lse).any()
    dq, dk, dv = qkv.attention_backward(q, q, q, q, out=out, lse=lse)
    assert np.isnan(dq).any()


@pytest.mark.parametrize("value", [-1e300, 1e300])
def test_a_finite_lse_that_overflows_the_gradients_is_named(value):
    q, out, lse = _varlen_case()
    want = lse[1, 4]
    lse[1, 4] = value
    with pytest.raises(ValueError) as e:
        qkv.varlen_attention_backward(q, q, q, q, out, lse, CU, CU)
    assert str(e.value) == (f"varlen_attention_backward: the gradients overflowed float32 because lse[1, 4] (head, "
                            f"packed query row) = {value:.6g} is not the forward's for these q, k and v (that row's is "
                            f"{want:.6g}): pass the lse that the forward returned with out")
    q, out, lse = _dense_case()
    want = lse[0, 1, 2]
    lse[0, 1, 2] = value
    with pytest.raises(ValueError) as e:
        qkv.attention_backward(q, q, q, q, out=out, lse=lse)
    assert str(e.value) == (f"attention_backward: the gradients overflowed float32 because lse[0, 1, 2] (batch, head, "
                            f"query row) = {value:.6g} is not the forward's for these q, k and v (that row's is "
                            f"{want:.6g}): pass the lse that the forward returned with out")


def test_a_varlen_gradient_overflow_suggests_only_what_varlen_takes():
    q = np.ones((4, 1, 2), np.float32)
    v = np.full((4, 1, 2), 1e38, np.float32)  # dout·v past 3.4e38
    out, lse = qkv.varlen_attention(q, q, v, [0, 2, 4], [0, 2, 4], return_lse=True)
    with pytest.raises(ValueError) as e:
        qkv.varlen_attention_backward(q, q, v, v, out, lse, [0, 2, 4], [0, 2, 4])
    assert str(e.value) == ("varlen_attention_backward: the gradients overflowed float32 although q, k, v and dout are "
                            "finite (scores, dout·v or gradient sums beyond 3.4e38); " + VARLEN_REMEDY)


def test_a_varlen_forward_overflow_names_varlen_and_suggests_only_what_varlen_takes():
    """It named attention_forward and suggested kernel="reference", which Python's varlen does not take."""
    q = np.full((4, 1, 2), 1e20, np.float32)  # scores past 3.4e38
    with pytest.raises(ValueError) as e:
        qkv.varlen_attention(q, q, q, [0, 2, 4], [0, 2, 4])
    assert str(e.value) == ("varlen_attention_forward: the output overflowed float32 although q, k and v are finite "
                            "(scores or P·V sums beyond 3.4e38); " + VARLEN_REMEDY)
