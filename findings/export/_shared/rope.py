"""GPT-J inverse RoPE in float64 (what upstream's inverse-RoPE kernels should compute), and a cos/sin cache of
random angles to run them with."""
import torch


def random_cos_sin(gen, positions, rope):
    """A ``[positions, rope]`` fp32 cos/sin cache (cos | sin) of angles drawn from ``gen`` in [0.5, 2.5)."""
    angles = torch.rand(positions, rope // 2, generator=gen, dtype=torch.float64) * 2.0 + 0.5
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


def inverse_rope(x, cos_sin_rows, nope):
    """``x`` with its lanes from ``nope`` on inverse-rotated as GPT-J pairs (a, b): even' = a*cos + b*sin,
    odd' = b*cos - a*sin, in float64. ``cos_sin_rows``: the cos | sin rows of the positions, broadcastable to
    ``x[..., nope::2]`` (one row, or one per leading index of ``x``)."""
    x = x.to(torch.float64).clone()
    cs = cos_sin_rows.to(torch.float64)
    half = cs.shape[-1] // 2
    cos, sin = cs[..., :half], cs[..., half:]
    a, b = x[..., nope::2].clone(), x[..., nope + 1::2].clone()
    x[..., nope::2] = a * cos + b * sin
    x[..., nope + 1::2] = b * cos - a * sin
    return x
