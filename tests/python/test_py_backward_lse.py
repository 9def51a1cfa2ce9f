"""What the fp32 backwards (qkv.attention_backward, qkv.varlen_attention_backward) make of an lse
that is not the forward's: a finite one that overflows the gradients is named as the cause (it
was blamed on q, k, v and dout, with a kernel="reference" that varlen does not take)."""
import numpy as np
import pytest

import qkv

CU = [0, 3, 6]


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
                            "finite (scores, dout·v or gradient sums beyond 3.4e38); scale the inputs down (varlen has "
                            "no float64 path)")
