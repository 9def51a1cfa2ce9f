"""PyTorch-style constructors for qkv.Optimizer, with torch.optim's defaults (momentum 0 for SGD,
weight decay 0.01 for AdamW), so code ported from torch trains alike."""

from . import _qkv


def SGD(layer, lr, momentum=0.0, weight_decay=0.0):
    """SGD with momentum over `layer`'s parameters, as torch.optim.SGD (dampening 0, no Nesterov):
    g += weight_decay * p; buf = momentum * buf + g (buf = g on the first step); p -= lr * buf.
    momentum=0 is plain SGD. Call .step() after layer.backward()."""
    return _qkv.Optimizer(layer, kind="sgd", lr=lr, momentum=momentum, weight_decay=weight_decay)


def AdamW(layer, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """AdamW over `layer`'s parameters, as torch.optim.AdamW: p -= lr * weight_decay * p, then
    p -= lr * m_hat / (sqrt(v_hat) + eps) with bias-corrected moments. Call .step() after
    layer.backward()."""
    return _qkv.Optimizer(layer, kind="adamw", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
