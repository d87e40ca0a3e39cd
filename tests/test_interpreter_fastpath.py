"""The interpreter's fast path (impl.interpreter_fastpath): a device call inside a launch skips re-patching
triton.language, and nothing an interpreted program computes changes; the language is restored after each launch."""
import pytest
import torch

import impl  # noqa: F401  (switches the interpreter on where no GPU is visible, and installs the fast path)
from impl import interpreter_fastpath as fp
from impl import runtime

pytestmark = pytest.mark.skipif(runtime.triton_mode() != "interpreter", reason="the fast path is interpreter-only")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _inner(x):
    return tl.exp(x) * 0.5 + tl.where(x > 0, x, -x)


@triton.jit
def _middle(x, y):
    m = tl.maximum(_inner(x), _inner(y))
    return tl.sum(m, axis=0) + _inner(x - y)


@triton.jit
def _kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(x_ptr + i)
    y = tl.load(y_ptr + i)
    acc = tl.zeros([N], tl.float32)
    for k in range(3):
        acc += _middle(x + k, y)
    tl.store(out_ptr + i, acc.to(tl.bfloat16))


@triton.jit
def _raising(x_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.static_assert(N < 0, "planted")
    tl.store(x_ptr + tl.arange(0, N), _inner(x))


def _launch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4 * 32, generator=g)
    y = torch.randn(4 * 32, generator=g)
    out = torch.empty(4 * 32, dtype=torch.bfloat16)
    _kernel[(4,)](x, y, out, N=32)
    return out


def _with_triton_own(monkeypatch):
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped__)


def test_installed_under_the_interpreter():
    assert fp.installed()
    assert hasattr(interpreter._patch_lang, "__wrapped__")


def test_results_are_the_bits_triton_own_patching_gives(monkeypatch):
    fast = _launch()
    _with_triton_own(monkeypatch)
    own = _launch()
    assert torch.equal(fast.view(torch.int16), own.view(torch.int16))


def test_device_calls_inside_a_launch_patch_nothing_and_the_launch_patches_once(monkeypatch):
    own = interpreter._patch_lang.__wrapped__
    calls = []

    def counting(fn):
        calls.append(fn.__name__)
        return own(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", fp.fast_patch_lang(counting, tl))
    _launch()
    _launch()
    # per launch, 4 programs x 3 iterations x (1 _middle + 3 _inner) device calls, all skipped; tl.zeros (a jit
    # function of triton.language.standard, whose globals hold triton.language.core, not triton.language) patches
    # that module the first time in each launch, as Triton does, and is skipped afterwards
    assert calls == ["_kernel", "zeros"] * 2, calls
    calls.clear()
    monkeypatch.setattr(interpreter, "_patch_lang", counting)  # Triton's own: every device call patches again
    _launch()
    assert len(calls) == 1 + 4 * (1 + 3 * (1 + 3 + 1)), len(calls)  # zeros; _middle, 3 _inner, tl.sum


def test_the_language_is_restored_after_a_launch_and_after_a_failing_one():
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.exp)
    _launch()
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.exp)
    assert getattr(fp._STATE, "active", None) is None
    with pytest.raises(Exception, match="planted"):
        _raising[(1,)](torch.zeros(8), N=8)
    assert getattr(fp._STATE, "active", None) is None
    assert tl.core.is_builtin(tl.load)
    _launch()  # and the next launch patches again


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SMV_INTERPRETER_FASTPATH", "0")
    monkeypatch.setattr(fp, "_INSTALLED", False)
    assert fp.install() is False


def _faults_at_worst_depth(call) -> int:
    """The most minor page faults 3,000 calls of a small function cost, over the caller depths 0..299 (a depth where
    the callee's frame starts a new CPython stack chunk maps and unmaps that chunk on every call)."""
    import resource

    def leaf(a, b, c, d):  # a frame larger than at_depth's, so some depth leaves less room than it needs
        e, f, g, h, i, j, k, m, o, p, q, r, s, t, u, v, w, x, y, z = range(20)
        return a + b + c + d + e + f + g + h + i + j + k + m + o + p + q + r + s + t + u + v + w + x + y + z

    def at_depth(n):
        if n:
            return at_depth(n - 1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3000):
            leaf(1, 2, 3, 4)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    return max(call(at_depth, n) for n in range(300))


def test_a_launch_has_room_for_its_frames_whatever_the_callers_depth():
    plain = _faults_at_worst_depth(lambda f, n: f(n))
    roomy = _faults_at_worst_depth(lambda f, n: fp.with_room(f, n))
    if plain < 3000:
        pytest.skip(f"this Python does not map a frame chunk per call at a chunk's end ({plain} faults at worst)")
    assert roomy < 300, (plain, roomy)
    # every interpreted launch runs inside with_room
    assert interpreter.GridExecutor.__call__.__wrapped__ is not None
