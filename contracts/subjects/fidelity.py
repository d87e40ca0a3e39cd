"""Interpreter fidelity for third-party kernels: under the Triton interpreter, compute what a GPU computes.

Our own kernels (``impl/``) are written around the interpreter's numerics; upstream's are written for a GPU. Under
``TRITON_INTERPRET=1`` (Triton 3.9) the interpreter gets these wrong, each seen with a one-program kernel:

``bf16-dot``
    ``tl.dot`` of bf16 tiles multiplies the raw 16-bit patterns as integers (a 16x16 product of N(0,1) data came
    out near 1.7e10); fp8 operands are widened through the interpreter's own fp8 decode (below).
``bf16-arith``
    bf16 values are held as uint16 words and ``+ - * fma neg min max clamp`` act on the words (1 + 2 gave inf,
    -x of 1 gave -4).
``bf16-reduce``
    so do ``tl.sum`` / ``tl.cumsum`` / ``tl.argmax`` of a bf16 tile.
``bf16-compare``
    comparisons act on the words too: ``k == k`` is true for a NaN (so ``where(k == k, k, 0)`` never scrubs one),
    ``-2 < 1`` is false, and -0 != +0.
``bf16-cast``
    fp32 -> bf16 truncates (1 + 2^-8 + 2^-9 gave 1.0, not 1 + 2^-7), ``fp_downcast_rounding="rtne"`` included,
    subnormals flush (2^-130 gave 0), ints -> bf16 put the integer into the word.
``fp8-decode``
    e4m3 (OCP ``float8e4nv``) codes 0x7F/0xFF decode as +-480 instead of NaN; FNUZ code 0x80 as -0 instead of
    NaN; e5m2's inf/NaN codes as finite numbers.
``fp8-encode``
    fp32 -> fp8 rounds wrongly (-0.4997 -> e4m3 0xA8 = -0.25 instead of 0xB0 = -0.5: the mantissa carry does not
    reach the exponent; subnormals round down): 477 of 4109 values differed from torch for e4m3.

Inside :func:`corrected` the interpreter's builder methods for these operations (``InterpreterBuilder`` casts,
elementwise binary/unary/ternary ops, fma, dot; the reduce and scan fast paths) are replaced by numpy-vectorized
ones that decode bf16/fp8 words to fp32 (exactly), compute there, and round back the way the hardware does:

- bf16 results: round to nearest even from fp32 (an fp64 value is first rounded to fp32, as torch and Triton's
  lowering do); a NaN stays NaN (quieted, sign kept; NaN payloads are not compared); an int goes through fp32.
  An fp32 product/sum of two bf16 values rounded once to bf16 is the correctly rounded bf16 result.
- ``tl.sum`` of bf16: accumulate in fp32, round once (what the H200 gave for a 256-element bf16 sum).
- fp8 results: round to nearest even, saturating to +-max for values beyond it, infinities included, NaN -> NaN:
  what an H200 (Triton 3.6, ``cvt.rn.satfinite``) gave for e4m3 and e5m2, where torch would give NaN or inf.
- dot: operands decoded to fp32, the product accumulated in fp32 with the accumulator.

Not corrected (no audited kernel meets them): fp32 ``tl.dot`` is computed exactly where a GPU may round operands
to tf32; atomics on bf16; Triton's own ``fp8e4b15``; ``tl.dot_scaled`` (its fp8 decode is already right).

``store-mask``
    a scalar comparison's handle keeps its operands' type (int32) though its data is bool, and a splat converts
    the data to that type: ``tl.store(block_ptrs, v, mask=pid < n)`` (a scalar bool mask broadcast to the block,
    as upstream's indexer-K gather does) is refused with "mask has unsupported dtype"; a GPU compiles it.
    Corrected by keeping a splatted bool as bool. A mask that really is int32 stays refused, as the compiler
    refuses it ("Mask must have boolean scalar type": the H200 rejected it at compile time with Triton 3.6).

Every correction is checked by :func:`self_test` against torch's own conversions and matmul, once per process, before
the subject's first kernel: :func:`corrected` raises :class:`~contracts.subjects.FidelityError` naming a failed
correction, and on a Triton it was not verified on (:data:`KNOWN_TRITON`) it raises rather than guess, so the
row is ``error``, never a silent verdict. Natively (no interpreter) it does nothing.

The patches are installed while at least one thread is inside :func:`corrected` and removed when the last one
leaves; each patched method acts only for a thread inside :func:`corrected` (any other thread, our own kernels
included, gets the interpreter's original methods), so entering is re-entrant and confined to its thread.

:func:`rewrites_for_host` picks the loader's named source rewrites for this host; the ones registered here make
upstream's gfx950 decode compile natively on an NVIDIA GPU with a Triton that lacks ``tl.cat(..., dim=)``.
"""
from __future__ import annotations

import contextlib
import inspect
import threading

import numpy as np

from impl.runtime import triton_mode  # impl chooses the Triton mode before triton is imported
import triton
import triton.language as tl

#: Triton versions whose interpreter these corrections were written against and self-tested on
KNOWN_TRITON = frozenset({"3.9.0"})

#: the corrections, by name (the names a failing self-test reports)
CORRECTIONS = ("bf16-cast", "bf16-arith", "bf16-compare", "bf16-reduce", "bf16-dot", "fp8-decode", "fp8-encode",
               "fp8-dot", "store-mask")


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter in this process."""
    return triton_mode() == "interpreter"


def triton_version() -> str:
    return str(getattr(triton, "__version__", "unknown"))


# --- numerics (numpy, vectorized) ------------------------------------------------------------------------------------

_U16 = np.dtype(np.uint16)


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """bf16 words (uint16) -> float32, exact (subnormals, infinities and NaN included)."""
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x, *, toward_zero: bool = False) -> np.ndarray:
    """float values -> bf16 words: round to nearest even from fp32 (an fp64 is rounded to fp32 first), or toward
    zero; overflow rounds to inf; a NaN stays a quiet NaN with its sign."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if toward_zero:
        rounded = bits >> np.uint32(16)
    else:
        # NaN lanes may wrap here; they are replaced below
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


class _Fp8:
    """One fp8 format: its 256 decoded values and the ordered non-negative finite values for encoding."""

    def __init__(self, name: str, ebits: int, mbits: int, bias: int, special: str):
        self.name = name
        c = np.arange(256)
        sign, e, m = c >> 7, (c >> mbits) & ((1 << ebits) - 1), c & ((1 << mbits) - 1)
        mag = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1.0 + m / 2.0 ** mbits) * 2.0 ** (e - bias))
        val = np.where(sign == 1, -mag, mag)
        emax, mmax = (1 << ebits) - 1, (1 << mbits) - 1
        if special == "fn":  # OCP e4m3: only all-ones is NaN, no infinities
            val = np.where((e == emax) & (m == mmax), np.nan, val)
        elif special == "ieee":  # OCP e5m2: IEEE-like top exponent
            val = np.where((e == emax) & (m == 0), np.where(sign == 1, -np.inf, np.inf), val)
            val = np.where((e == emax) & (m != 0), np.nan, val)
        else:  # FNUZ: 0x80 (negative zero) is the only NaN
            val = np.where(c == 0x80, np.nan, val)
        self.decode = val.astype(np.float32)
        pos = val[:128]
        self.max_code = int(np.flatnonzero(np.isfinite(pos))[-1])
        self.pos = pos[: self.max_code + 1].astype(np.float64)  # codes 0..max_code, increasing
        self.fnuz = special == "fnuz"
        self.nan_code = 0x80 if self.fnuz else 0x7F

    def encode(self, x, *, toward_zero: bool = False) -> np.ndarray:
        """float values -> codes: nearest even (or toward zero), saturating to +-max (infinities too), NaN -> NaN."""
        x = np.asarray(x, dtype=np.float64)
        nan = np.isnan(x)
        neg = np.signbit(x)
        a = np.where(nan, 0.0, np.minimum(np.abs(x), self.pos[-1]))
        lo = np.searchsorted(self.pos, a, side="right") - 1
        if toward_zero:
            code = lo
        else:
            hi = np.minimum(lo + 1, self.max_code)
            mid = (self.pos[lo] + self.pos[hi]) * 0.5  # exact: fp8 values have few bits
            up = ((a > mid) | ((a == mid) & ((lo & 1) == 1))) & (hi > lo)
            code = lo + up
        if self.fnuz:
            code = np.where(neg & (code != 0), code | 0x80, code)
            code = np.where(nan, 0x80, code)
        else:
            code = np.where(neg, code | 0x80, code)
            code = np.where(nan, np.where(neg, 0xFF, 0x7F), code)
        return code.astype(np.uint8)


#: Triton's fp8 type names -> formats (``fp8e4b15``, Triton's own, is left to the interpreter)
_FP8 = {
    "fp8e4nv": _Fp8("fp8e4nv", 4, 3, 7, "fn"),
    "fp8e4b8": _Fp8("fp8e4b8", 4, 3, 8, "fnuz"),
    "fp8e5": _Fp8("fp8e5", 5, 2, 15, "ieee"),
    "fp8e5b16": _Fp8("fp8e5b16", 5, 2, 16, "fnuz"),
}


# --- the patched interpreter methods ---------------------------------------------------------------------------------

_TLS = threading.local()
_LOCK = threading.RLock()
_INSTALLED = {"count": 0, "saved": []}
_ORIG: dict = {}


def _on() -> bool:
    return getattr(_TLS, "depth", 0) > 0


def _name(ty) -> str:
    return getattr(ty, "name", "")


def _is_bf16(h) -> bool:
    return h.data.dtype == _U16 and _name(h.dtype) == "bf16"


def _floats(h) -> np.ndarray:
    """A handle's values as floats (bf16 and fp8 words decoded); other data as it is."""
    n = _name(h.dtype)
    if n == "bf16" and h.data.dtype == _U16:
        return bf16_to_f32(h.data)
    fmt = _FP8.get(n)
    if fmt is not None and h.data.dtype == np.uint8:
        return fmt.decode[h.data]
    return h.data


def _make(data, ty):
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle(data, ty)


def _bf16_result(out, fallback_ty):
    if out.dtype == np.bool_:
        return _make(out, tl.int1)
    return _make(f32_to_bf16(out), tl.bfloat16 if fallback_ty is None else fallback_ty)


def _binary_op(self, lhs, rhs, op):
    if _on() and (_is_bf16(lhs) or _is_bf16(rhs)):
        with np.errstate(all="ignore"):
            out = np.asarray(op(_floats(lhs), _floats(rhs)))
        return _bf16_result(out, None)
    return _ORIG["binary_op"](self, lhs, rhs, op)


def _unary_op(self, arg, op):
    if _on() and _is_bf16(arg):
        if op is np.negative:  # a sign flip, exact for every word (NaN too)
            return _make(arg.data ^ np.uint16(0x8000), arg.dtype)
        with np.errstate(all="ignore"):
            return _bf16_result(np.asarray(op(bf16_to_f32(arg.data))), None)
    return _ORIG["unary_op"](self, arg, op)


def _ternary_op(self, lhs, rhs, other, op):
    # only clamp computes; select (np.where) moves words and is exact as it is
    if _on() and op is np.clip and (_is_bf16(lhs) or _is_bf16(rhs) or _is_bf16(other)):
        with np.errstate(all="ignore"):
            return _bf16_result(np.asarray(op(_floats(lhs), _floats(rhs), _floats(other))), None)
    return _ORIG["ternary_op"](self, lhs, rhs, other, op)


def _create_fma(self, x, y, z):
    if _on() and (_is_bf16(x) or _is_bf16(y) or _is_bf16(z)):
        with np.errstate(all="ignore"):
            exact = np.multiply(_floats(x), _floats(y), dtype=np.float64) + _floats(z).astype(np.float64)
        return _bf16_result(exact, None)
    return _ORIG["create_fma"](self, x, y, z)


def _cast_impl(self, src, dst_type):
    if _on():
        dst = dst_type.scalar
        if _is_bf16(src):
            f = bf16_to_f32(src.data)
            if dst.is_floating():
                from triton.runtime.interpreter import _get_np_dtype

                return _make(f.astype(_get_np_dtype(dst)), dst)
            # float -> int the way the interpreter converts an fp32
            return _ORIG["cast_impl"](self, _make(f, tl.float32), dst_type)
        if _name(dst) == "bf16":
            with np.errstate(all="ignore"):
                f = np.asarray(src.data).astype(np.float32)  # ints and fp64 round to fp32 first, as on a GPU
            return _make(f32_to_bf16(f), tl.bfloat16)
    return _ORIG["cast_impl"](self, src, dst_type)


def _create_fp_to_fp(self, src, dst_type, rounding_mode):
    if _on():
        sname, dst = _name(src.dtype), dst_type.scalar
        dname = _name(dst)
        special = ("bf16",) + tuple(_FP8)
        if (sname in special or dname in special) and "fp8e4b15" not in (sname, dname):
            from triton._C.libtriton import ir
            from triton.runtime.interpreter import _get_np_dtype

            rtz = rounding_mode == ir.ROUNDING_MODE.RTZ
            x = _floats(src)
            if dname in _FP8:
                with np.errstate(all="ignore"):
                    data = _FP8[dname].encode(x, toward_zero=rtz)
            elif dname == "bf16":
                with np.errstate(all="ignore"):
                    data = f32_to_bf16(np.asarray(x).astype(np.float32), toward_zero=rtz)
            elif sname in special and not rtz:
                data = np.asarray(x).astype(_get_np_dtype(dst))
            else:
                return _ORIG["create_fp_to_fp"](self, src, dst_type, rounding_mode)
            return _make(data, dst)
    return _ORIG["create_fp_to_fp"](self, src, dst_type, rounding_mode)


def _dot_operand(h):
    n = _name(h.dtype)
    return n == "bf16" or n in _FP8


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if _on() and (_dot_operand(a) or _dot_operand(b)) and "fp8e4b15" not in (_name(a.dtype), _name(b.dtype)):
        acc = _floats(d).astype(np.float32)
        with np.errstate(all="ignore"):
            out = np.matmul(_floats(a).astype(np.float32), _floats(b).astype(np.float32)) + acc
        if _is_bf16(d):
            return _make(f32_to_bf16(out), d.dtype)
        return _make(out.astype(d.data.dtype), d.dtype)
    return _ORIG["create_dot"](self, a, b, d, input_precision, max_num_imprecise_acc)


def _reduce_sum(self, input):
    if _on() and _is_bf16(input.handle):
        with np.errstate(all="ignore"):
            s = np.sum(bf16_to_f32(input.handle.data), axis=self.axis, keepdims=self.keep_dims, dtype=np.float32)
        return self.to_tensor(f32_to_bf16(s), input.dtype)
    return _ORIG["ReduceOps.sum"](self, input)


def _reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
    x = input[0] if isinstance(input, tuple) else input
    if _on() and _is_bf16(x.handle):
        f = bf16_to_f32(x.handle.data)
        val = idx = None
        with np.errstate(all="ignore"):
            if val_reduce_op:
                val = self.to_tensor(f32_to_bf16(np.asarray(
                    val_reduce_op(f, axis=self.axis, keepdims=self.keep_dims))), x.dtype)
            if idx_reduce_op:
                idx = self.to_tensor(idx_reduce_op(f, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx
    return _ORIG["ReduceOps.min_max"](self, input, val_reduce_op, idx_reduce_op)


def _scan(kind):
    def scan(self, input):
        if _on() and _is_bf16(input.handle):
            op = np.cumsum if kind == "cumsum" else np.cumprod
            with np.errstate(all="ignore"):
                r = op(bf16_to_f32(input.handle.data), axis=self.axis, dtype=np.float32)
            return [self.to_tensor(f32_to_bf16(r), input.dtype)]
        return _ORIG[f"ScanOps.{kind}"](self, input)

    return scan


def _create_splat(self, ret_ty, arg):
    out = _ORIG["create_splat"](self, ret_ty, arg)
    if _on() and arg.data.dtype == np.bool_ and out.data.dtype != np.bool_:
        return _make(out.data.astype(np.bool_), tl.int1)
    return out


def _patches():
    from triton.runtime import interpreter as it

    b, r, s = it.InterpreterBuilder, it.ReduceOps, it.ScanOps
    return [
        (b, "binary_op", "binary_op", _binary_op),
        (b, "unary_op", "unary_op", _unary_op),
        (b, "ternary_op", "ternary_op", _ternary_op),
        (b, "create_fma", "create_fma", _create_fma),
        (b, "cast_impl", "cast_impl", _cast_impl),
        (b, "create_fp_to_fp", "create_fp_to_fp", _create_fp_to_fp),
        (b, "create_dot", "create_dot", _create_dot),
        (b, "create_splat", "create_splat", _create_splat),
        (r, "sum", "ReduceOps.sum", _reduce_sum),
        (r, "min_max", "ReduceOps.min_max", _reduce_min_max),
        (s, "cumsum", "ScanOps.cumsum", _scan("cumsum")),
        (s, "cumprod", "ScanOps.cumprod", _scan("cumprod")),
    ]


def _missing_hooks() -> list[str]:
    """The interpreter internals the corrections replace that this Triton does not have."""
    try:
        from triton.runtime import interpreter as it
    except Exception as exc:  # noqa: BLE001
        return [f"triton.runtime.interpreter ({exc})"]
    out = []
    for cls_name, attr in (("InterpreterBuilder", "binary_op"), ("InterpreterBuilder", "unary_op"),
                           ("InterpreterBuilder", "ternary_op"), ("InterpreterBuilder", "create_fma"),
                           ("InterpreterBuilder", "cast_impl"), ("InterpreterBuilder", "create_fp_to_fp"),
                           ("InterpreterBuilder", "create_dot"), ("InterpreterBuilder", "create_splat"),
                           ("ReduceOps", "sum"), ("ReduceOps", "min_max"),
                           ("ScanOps", "cumsum"), ("ScanOps", "cumprod")):
        owner = getattr(it, cls_name, None)
        if owner is None or attr not in owner.__dict__:  # replaced in place, so it must be the class's own
            out.append(f"{cls_name}.{attr}")
    for name in ("TensorHandle", "_get_np_dtype", "ReduceOps.to_tensor", "ScanOps.to_tensor"):
        owner, attr = (getattr(it, name.split(".")[0], None), name.split(".")[1]) if "." in name else (it, name)
        if not hasattr(owner, attr):
            out.append(name)
    return out


def _install():
    saved = []
    for owner, attr, key, fn in _patches():
        original = owner.__dict__[attr]
        _ORIG[key] = original
        saved.append((owner, attr, original))
        setattr(owner, attr, fn)
    _INSTALLED["saved"] = saved


def _uninstall():
    for owner, attr, original in reversed(_INSTALLED["saved"]):
        setattr(owner, attr, original)
    _INSTALLED["saved"] = []


@contextlib.contextmanager
def _applied():
    """The corrections, for this thread, without the version check or the self-test."""
    with _LOCK:
        if _INSTALLED["count"] == 0:
            _install()
        _INSTALLED["count"] += 1
    _TLS.depth = getattr(_TLS, "depth", 0) + 1
    try:
        yield
    finally:
        _TLS.depth -= 1
        with _LOCK:
            _INSTALLED["count"] -= 1
            if _INSTALLED["count"] == 0:
                _uninstall()


def active() -> bool:
    """Whether the corrections act for the calling thread now."""
    return _on()


def _check_host() -> None:
    from contracts.subjects.base import FidelityError

    version = triton_version()
    if version not in KNOWN_TRITON:
        raise FidelityError(
            f"triton {version}: interpreter corrections not verified on this version (verified on "
            f"{', '.join(sorted(KNOWN_TRITON))}); a third-party kernel's result under this interpreter could be the "
            f"interpreter's numerics, not the kernel's")
    missing = _missing_hooks()
    if missing:
        raise FidelityError(f"triton {version}: the interpreter lacks {', '.join(missing)}; "
                            f"the corrections cannot be applied")


@contextlib.contextmanager
def corrected():
    """Run third-party kernels with the interpreter's numerics corrected (a no-op natively).

    Raises :class:`~contracts.subjects.FidelityError` on a Triton the corrections were not verified on, or when
    :func:`self_test` finds a correction that does not reproduce torch's results."""
    if not interpreting():
        yield
        return
    from contracts.subjects.base import FidelityError

    _check_host()
    failures = self_test()
    if failures:
        names = sorted({f.split(":", 1)[0] for f in failures})
        raise FidelityError(f"triton {triton_version()}: interpreter corrections failed their self-test "
                            f"({', '.join(names)}): {failures[0]}")
    with _applied():
        yield


# --- self-test -------------------------------------------------------------------------------------------------------

_SELF_TEST: dict = {}
_SELF_TEST_LOCK = threading.Lock()


def self_test(*, refresh: bool = False) -> list[str]:
    """Check every correction against torch (once per process; cached): a list of ``"<correction>: what differs"``,
    empty when all hold. Natively there is nothing to check."""
    if not interpreting():
        return []
    with _SELF_TEST_LOCK:
        if refresh or "result" not in _SELF_TEST:
            try:
                _check_host()
            except Exception as exc:  # noqa: BLE001 - a FidelityError: reported as the failure
                _SELF_TEST["result"] = [f"version: {exc}"]
            else:
                with _applied():
                    _SELF_TEST["result"] = _run_checks()
        return list(_SELF_TEST["result"])


@contextlib.contextmanager
def _uncached_self_test():
    """For the tests: a self-test run afresh, the cached result restored after."""
    with _SELF_TEST_LOCK:
        saved = dict(_SELF_TEST)
        _SELF_TEST.clear()
    try:
        yield
    finally:
        with _SELF_TEST_LOCK:
            _SELF_TEST.clear()
            _SELF_TEST.update(saved)


_KERNELS: dict = {}


def kernels():
    """The self-test's kernels (decorated on first use, so the interpreter's mode is the one in force)."""
    if _KERNELS:
        return _KERNELS

    @triton.jit
    def cast_f32(x_ptr, rne_ptr, rtz_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        x = tl.load(x_ptr + r)
        tl.store(rne_ptr + r, x.to(tl.bfloat16))
        tl.store(rtz_ptr + r, x.to(tl.bfloat16, fp_downcast_rounding="rtz"))

    @triton.jit
    def cast_words(w_ptr, i_ptr, f_ptr, ib_ptr, bi_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        w = tl.load(w_ptr + r)
        tl.store(f_ptr + r, w.to(tl.float32))
        tl.store(ib_ptr + r, tl.load(i_ptr + r).to(tl.bfloat16))
        tl.store(bi_ptr + r, tl.where(w == w, w, 0.0).to(tl.int32))

    @triton.jit
    def bf16_ops(x_ptr, y_ptr, out_ptr, cmp_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        x = tl.load(x_ptr + r)
        y = tl.load(y_ptr + r)
        tl.store(out_ptr + 0 * N + r, x + y)
        tl.store(out_ptr + 1 * N + r, x - y)
        tl.store(out_ptr + 2 * N + r, x * y)
        tl.store(out_ptr + 3 * N + r, (x / y).to(tl.bfloat16))
        tl.store(out_ptr + 4 * N + r, -x)
        tl.store(out_ptr + 5 * N + r, tl.maximum(x, y))
        tl.store(out_ptr + 6 * N + r, tl.minimum(x, y))
        tl.store(out_ptr + 7 * N + r, tl.fma(x, y, x))
        tl.store(out_ptr + 8 * N + r, tl.clamp(x, -2.0, 3.0))
        tl.store(out_ptr + 9 * N + r, tl.where(x == x, x, tl.zeros((N,), dtype=tl.bfloat16)))
        tl.store(out_ptr + 10 * N + r, tl.clamp(x, -2.0, 3.0, propagate_nan=tl.PropagateNan.ALL))
        tl.store(cmp_ptr + 0 * N + r, (x == y).to(tl.int8))
        tl.store(cmp_ptr + 1 * N + r, (x != y).to(tl.int8))
        tl.store(cmp_ptr + 2 * N + r, (x < y).to(tl.int8))
        tl.store(cmp_ptr + 3 * N + r, (x <= y).to(tl.int8))
        tl.store(cmp_ptr + 4 * N + r, (x > y).to(tl.int8))
        tl.store(cmp_ptr + 5 * N + r, (x >= y).to(tl.int8))
        tl.store(cmp_ptr + 6 * N + r, (x == x).to(tl.int8))

    @triton.jit
    def bf16_reduce(x_ptr, sum_ptr, arg_ptr, cum_ptr, R: tl.constexpr, C: tl.constexpr):
        rr = tl.arange(0, R)
        rc = tl.arange(0, C)
        x = tl.load(x_ptr + rr[:, None] * C + rc[None, :])
        tl.store(sum_ptr + rr, tl.sum(x, axis=1))
        tl.store(arg_ptr + rr, tl.argmax(x, axis=1))
        tl.store(cum_ptr + rr[:, None] * C + rc[None, :], tl.cumsum(x, axis=1))

    @triton.jit
    def fp8_decode(c_ptr, f_ptr, b_ptr, FMT: tl.constexpr, N: tl.constexpr):
        r = tl.arange(0, N)
        c = tl.load(c_ptr + r)
        if FMT == 0:
            v = c.to(tl.float8e4nv, bitcast=True)
        elif FMT == 1:
            v = c.to(tl.float8e4b8, bitcast=True)
        elif FMT == 2:
            v = c.to(tl.float8e5, bitcast=True)
        else:
            v = c.to(tl.float8e5b16, bitcast=True)
        tl.store(f_ptr + r, v.to(tl.float32))
        tl.store(b_ptr + r, v.to(tl.bfloat16))

    @triton.jit
    def fp8_encode(x_ptr, o_ptr, ob_ptr, FMT: tl.constexpr, N: tl.constexpr):
        r = tl.arange(0, N)
        x = tl.load(x_ptr + r)
        xb = x.to(tl.bfloat16)
        if FMT == 0:
            v = x.to(tl.float8e4nv)
            vb = xb.to(tl.float8e4nv)
        elif FMT == 1:
            v = x.to(tl.float8e4b8)
            vb = xb.to(tl.float8e4b8)
        elif FMT == 2:
            v = x.to(tl.float8e5)
            vb = xb.to(tl.float8e5)
        else:
            v = x.to(tl.float8e5b16)
            vb = xb.to(tl.float8e5b16)
        tl.store(o_ptr + r, v.to(tl.uint8, bitcast=True))
        tl.store(ob_ptr + r, vb.to(tl.uint8, bitcast=True))

    @triton.jit
    def dot(a_ptr, b_ptr, c_ptr, o_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, FP8: tl.constexpr):
        rm = tl.arange(0, M)
        rk = tl.arange(0, K)
        rn = tl.arange(0, N)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
        if FP8 == 1:
            a = a.to(tl.float8e4nv, bitcast=True)
            b = b.to(tl.float8e4nv, bitcast=True)
        elif FP8 == 2:
            a = a.to(tl.float8e4b8, bitcast=True)
            b = b.to(tl.float8e4b8, bitcast=True)
        acc = tl.load(c_ptr + rm[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
        tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc)

    @triton.jit
    def store_mask(o_ptr, v, AS_INT: tl.constexpr):
        if AS_INT:
            tl.store(o_ptr, 7, mask=v)
        else:
            tl.store(o_ptr, 7, mask=v > 0)

    @triton.jit
    def block_mask(src_ptr, o_ptr, n, W: tl.constexpr):
        pid = tl.program_id(0)
        live = pid < n  # a scalar bool, broadcast to the block by the load and the store
        offs = pid * W + tl.arange(0, W)
        v = tl.load(src_ptr + offs, mask=live, other=-1)
        tl.store(o_ptr + offs, v, mask=live)

    _KERNELS.update(cast_f32=cast_f32, cast_words=cast_words, bf16_ops=bf16_ops, bf16_reduce=bf16_reduce,
                    fp8_decode=fp8_decode, fp8_encode=fp8_encode, dot=dot, store_mask=store_mask,
                    block_mask=block_mask)
    return _KERNELS


def _diff(name: str, got, want, what: str, *, bits: bool = True) -> list[str]:
    """``got`` vs ``want`` (torch tensors): bit-equal (or value-equal) where both are numbers, both NaN where one is."""
    import torch

    g, w = got.float(), want.float()
    both_nan = g.isnan() & w.isnan()
    if bits and got.dtype == want.dtype and got.dtype in (torch.bfloat16, torch.float32):
        iv = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
        same = (got.view(iv) == want.view(iv)) | both_nan
    else:
        same = (g == w) | both_nan
    bad = (~same).flatten().nonzero().flatten()
    if bad.numel() == 0:
        return []
    i = int(bad[0])
    return [f"{name}: {what}: {bad.numel()} of {same.numel()} differ from torch, first at {i}: "
            f"got {g.flatten()[i].item()!r}, torch {w.flatten()[i].item()!r}"]


def _bf16_samples(n: int, seed: int):
    """bf16 values over every exponent plus the specials (±0, ±inf, NaN, subnormals, ±max)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    words = torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int32)
    # NaNs quieted: torch's CPU fmax/fmin treat a signaling NaN as NaN-producing, a GPU's max/min do not
    nan = ((words & 0x7F80) == 0x7F80) & ((words & 0x7F) != 0)
    words = torch.where(nan, words | 0x40, words)
    x = words.to(torch.int16).view(torch.bfloat16).clone()
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0, 2.0, -2.0, 3.0,
                             2.0 ** -133, -(2.0 ** -130), 3.3895313892515355e38, -3.3895313892515355e38, 0.5, 1.5],
                            dtype=torch.float32).to(torch.bfloat16)
    x[: specials.numel()] = specials
    return x


def _check_bf16_cast(k) -> list[str]:
    import torch

    g = torch.Generator().manual_seed(1)
    n = 1 << 14
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    # a quarter exact ties (bf16 word then 0x8000), odd and even, of either sign; overflow at the top
    ties = (torch.randint(0, 1 << 16, (n // 4,), generator=g, dtype=torch.int64) << 16) | 0x8000
    bits[: n // 4] = ties.to(torch.int32)  # wraps to the same 32 bits
    x = bits.view(torch.float32).clone()
    x[:8] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3.4028234663852886e38,
                          1.0 + 2 ** -8, 2.0 ** -130])
    rne = torch.empty(n, dtype=torch.bfloat16)
    rtz = torch.empty(n, dtype=torch.bfloat16)
    k["cast_f32"][(1,)](x, rne, rtz, n)
    out = _diff("bf16-cast", rne, x.to(torch.bfloat16), "fp32 -> bf16 (nearest even)")
    # toward zero: the upper half of the word, with NaN kept NaN (torch has no such cast)
    want_rtz = torch.where(x.isnan(), x, (x.view(torch.int32) & ~0xFFFF).view(torch.float32)).to(torch.bfloat16)
    out += _diff("bf16-cast", rtz, want_rtz, "fp32 -> bf16 (toward zero)")
    words = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    ints = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32)
    ints[:4] = torch.tensor([0, -1, (1 << 24) + 1, (1 << 31) - 1], dtype=torch.int32)
    f = torch.empty(1 << 16)
    ib = torch.empty(1 << 16, dtype=torch.bfloat16)
    bi = torch.empty(1 << 16, dtype=torch.int32)
    b = words.view(torch.bfloat16)
    k["cast_words"][(1,)](words.view(torch.bfloat16), ints, f, ib, bi, 1 << 16)
    out += _diff("bf16-cast", f, b.float(), "bf16 -> fp32, all 65536 words")
    out += _diff("bf16-cast", ib, ints.to(torch.bfloat16), "int32 -> bf16")
    finite = b.float().abs() < 2.0 ** 31
    out += _diff("bf16-cast", bi[finite], b[finite].to(torch.int32), "bf16 -> int32 (in range)")
    return out


def _check_bf16_ops(k) -> list[str]:
    import torch

    n = 1 << 12
    x = _bf16_samples(n, 2)
    y = _bf16_samples(n, 3)
    # pairs of related values, so comparisons meet equal operands and ±0 against each other
    y[16:32] = x[:16]
    y[32] = torch.tensor(0.0).to(torch.bfloat16)
    x[33] = torch.tensor(-0.0).to(torch.bfloat16)
    outs = torch.empty(11 * n, dtype=torch.bfloat16)
    cmps = torch.empty(7 * n, dtype=torch.int8)
    k["bf16_ops"][(1,)](x, y, outs, cmps, n)
    o = outs.view(11, n)
    c = cmps.view(7, n)
    out = []
    xf, yf = x.float(), y.float()
    for i, (what, want) in enumerate([
            ("x + y", x + y), ("x - y", x - y), ("x * y", x * y), ("x / y (fp32, rounded)", (xf / yf).bfloat16()),
            # tl.maximum / tl.minimum / tl.clamp default to NaN-ignoring (maxnum), as fmax / fmin are
            ("-x", -x), ("maximum", torch.fmax(x, y)), ("minimum", torch.fmin(x, y)),
            ("fma(x, y, x)", (x.double() * y.double() + x.double()).to(torch.bfloat16)),
            ("clamp(x, -2, 3)", torch.fmin(torch.fmax(x, torch.full_like(x, -2.0)), torch.full_like(x, 3.0))),
            ("where(x == x, x, 0)", torch.where(x == x, x, torch.zeros_like(x))),
            ("clamp(x, -2, 3, propagate_nan=ALL)", torch.clamp(x, -2.0, 3.0))]):
        # the sign of a zero picked by max/min among ±0 is not specified: values compared there
        out += _diff("bf16-arith", o[i], want, what, bits=what not in ("maximum", "minimum"))
    for i, (what, want) in enumerate([("==", x == y), ("!=", x != y), ("<", x < y), ("<=", x <= y), (">", x > y),
                                      (">=", x >= y), ("x == x (NaN)", x == x)]):
        out += _diff("bf16-compare", c[i], want.to(torch.int8), what)
    return out


def _check_bf16_reduce(k) -> list[str]:
    import torch

    g = torch.Generator().manual_seed(4)
    R, C = 8, 64
    # small dyadic values: every fp32 partial sum is exact, so the order of the sum does not matter
    x = (torch.randint(-64, 65, (R, C), generator=g).float() / 8).to(torch.bfloat16)
    x[1, 5] = float("nan")
    x[2, :] = torch.tensor(-3.0).to(torch.bfloat16)
    x[2, 7] = torch.tensor(-0.5).to(torch.bfloat16)
    s = torch.empty(R, dtype=torch.bfloat16)
    a = torch.empty(R, dtype=torch.int32)
    cs = torch.empty(R, C, dtype=torch.bfloat16)
    k["bf16_reduce"][(1,)](x, s, a, cs, R, C)
    out = _diff("bf16-reduce", s, x.float().sum(1).to(torch.bfloat16), "sum")
    keep = ~x.float().isnan().any(1)  # argmax of a row holding NaN differs between backends; not compared
    out += _diff("bf16-reduce", a[keep], x.float().argmax(1).to(torch.int32)[keep], "argmax")
    out += _diff("bf16-reduce", cs, x.float().cumsum(1).to(torch.bfloat16), "cumsum")
    return out


def _check_dot(k) -> list[str]:
    import torch

    g = torch.Generator().manual_seed(5)
    M, K, N = 16, 32, 16
    out = []
    # small integers: every product and partial sum exact in fp32, so the result is bitwise torch's
    a = torch.randint(-8, 9, (M, K), generator=g).float().to(torch.bfloat16)
    b = torch.randint(-8, 9, (K, N), generator=g).float().to(torch.bfloat16)
    c = torch.randint(-100, 101, (M, N), generator=g).float()
    o = torch.empty(M, N)
    k["dot"][(1,)](a, b, c, o, M, K, N, 0)
    out += _diff("bf16-dot", o, a.float() @ b.float() + c, "bf16 tl.dot, exact data")
    # N(0,1) data and a NaN: within fp32 rounding of the sum, NaN where torch has NaN
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, generator=g).to(torch.bfloat16)
    a[3, 5] = float("nan")
    c = torch.randn(M, N, generator=g)
    k["dot"][(1,)](a, b, c, o, M, K, N, 0)
    want = a.float() @ b.float() + c
    tol = 1e-5 * ((a.float().abs() @ b.float().abs()) + c.abs()) + 1e-30
    close = ((o - want).abs() <= tol) | (o.isnan() & want.isnan())
    if not bool(close.all()):
        i = int((~close).flatten().nonzero()[0])
        out.append(f"bf16-dot: bf16 tl.dot, N(0,1) data: {int((~close).sum())} of {close.numel()} outside fp32 "
                   f"rounding, first at {i}: got {o.flatten()[i].item()!r}, torch {want.flatten()[i].item()!r}")
    # fp8: every code times the identity (1.0), so each output is the decoded code (a NaN code's row goes NaN)
    for fp8, td, one in ((1, torch.float8_e4m3fn, 0x38), (2, torch.float8_e4m3fnuz, 0x40)):
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(16, 16)
        eye = (torch.eye(16, dtype=torch.int32) * one).to(torch.uint8)
        z = torch.zeros(16, 16)
        o = torch.empty(16, 16)
        k["dot"][(1,)](codes, eye, z, o, 16, 16, 16, fp8)
        out += _diff("fp8-dot", o, codes.view(td).float() @ eye.view(td).float(), f"{td} tl.dot with the identity",
                     bits=False)
    return out


_TORCH_FP8 = (("float8_e4m3fn", 448.0), ("float8_e4m3fnuz", 240.0), ("float8_e5m2", 57344.0),
              ("float8_e5m2fnuz", 57344.0))


def _check_fp8(k) -> list[str]:
    import torch

    out = []
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    g = torch.Generator().manual_seed(6)
    for fmt, (tname, fmax) in enumerate(_TORCH_FP8):
        td = getattr(torch, tname)
        f = torch.empty(256)
        b = torch.empty(256, dtype=torch.bfloat16)
        k["fp8_decode"][(1,)](codes, f, b, fmt, 256)
        out += _diff("fp8-decode", f, codes.view(td).float(), f"{tname} -> fp32, all 256 codes")
        out += _diff("fp8-decode", b, codes.view(td).to(torch.bfloat16), f"{tname} -> bf16, all 256 codes")
        # encode: every midpoint between neighbouring codes (ties), values just off them, values over the range,
        # subnormals, and the specials; beyond +-max the GPU saturates (torch's clamp then cast)
        vals = codes.view(td).float()
        pos = vals[:128][vals[:128].isfinite()].sort().values
        mids = (pos[1:] + pos[:-1]) / 2  # exact in fp32
        spread = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-20, 17, (4096,), generator=g).float())
        x = torch.cat([pos, mids, mids.nextafter(torch.zeros(())), mids.nextafter(torch.full((), float("inf"))),
                       spread, torch.tensor([float("nan"), float("inf"), fmax * 1.5, 1e30, 2.0 ** -40])])
        x = torch.cat([x, -x])
        n = 1 << (x.numel() - 1).bit_length()
        xp = torch.zeros(n)
        xp[: x.numel()] = x
        o = torch.empty(n, dtype=torch.uint8)
        ob = torch.empty(n, dtype=torch.uint8)
        k["fp8_encode"][(1,)](xp, o, ob, fmt, n)
        out += _diff_codes(o, xp.clamp(-fmax, fmax).to(td), td, f"fp32 -> {tname} (nearest even, saturating)")
        out += _diff_codes(ob, xp.to(torch.bfloat16).float().clamp(-fmax, fmax).to(td), td,
                           f"bf16 -> {tname} (nearest even, saturating)")
    return out


def _diff_codes(got, want, td, what: str) -> list[str]:
    """fp8 code bytes: equal, or both NaN codes."""
    import torch

    w = want.view(torch.uint8)
    same = (got == w) | (got.view(td).float().isnan() & want.float().isnan())
    bad = (~same).nonzero().flatten()
    if bad.numel() == 0:
        return []
    i = int(bad[0])
    return [f"fp8-encode: {what}: {bad.numel()} of {same.numel()} differ from torch, first for "
            f"{want.float()[i].item()!r}: got code {int(got[i]):#04x}, torch {int(w[i]):#04x}"]


def _check_store_mask(k) -> list[str]:
    import torch

    out = []
    src = torch.arange(12, dtype=torch.int32)
    o = torch.zeros(12, dtype=torch.int32)
    try:
        k["block_mask"][(3,)](src, o, 2, 4)
    except Exception as exc:  # noqa: BLE001 - the interpreter's refusal is the defect
        out.append(f"store-mask: a block load/store under a scalar bool mask failed: {exc!r}")
    else:
        want = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0], dtype=torch.int32)
        if not torch.equal(o, want):
            out.append(f"store-mask: a block store under a scalar bool mask wrote {o.tolist()}, "
                       f"expected {want.tolist()}")
    for v, want in ((1, 7), (0, 0)):
        o = torch.zeros(1, dtype=torch.int32)
        k["store_mask"][(1,)](o, v, False)
        if int(o[0]) != want:
            out.append(f"store-mask: a bool scalar mask ({v} > 0) stored {int(o[0])}, expected {want}")
    o = torch.zeros(1, dtype=torch.int32)
    try:
        k["store_mask"][(1,)](o, 1, True)
    except Exception as exc:  # noqa: BLE001 - the semantic layer's ValueError, wrapped by the interpreter
        if "boolean" not in str(exc):
            out.append(f"store-mask: an int32 scalar mask failed otherwise than a GPU compile does: {exc!r}")
    else:
        out.append("store-mask: an int32 scalar mask was accepted; Triton's compiler rejects it ('Mask must have "
                   "boolean scalar type'), so the interpreter no longer matches a GPU here")
    return out


def _run_checks() -> list[str]:
    k = kernels()
    out: list[str] = []
    for check in (_check_bf16_cast, _check_bf16_ops, _check_bf16_reduce, _check_dot, _check_fp8, _check_store_mask):
        try:
            with np.errstate(all="ignore"):  # overflow and NaN on purpose
                out += check(k)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed correction
            out.append(f"{check.__name__[len('_check_'):].replace('_', '-')}: the check raised {exc!r}")
    return out


# --- source rewrites for this host -----------------------------------------------------------------------------------

_OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"


def _triton_cat_has_dim() -> bool:
    try:
        return "dim" in inspect.signature(tl.cat).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return True


def _on_hip() -> bool:
    try:
        import torch

        return getattr(torch.version, "hip", None) is not None
    except ImportError:  # pragma: no cover
        return False


#: rewrite id -> when it is needed on a native host (beyond its ``when``)
_NATIVE_NEEDS = {
    "native-tl-cat-dim1": lambda: not _triton_cat_has_dim(),
    "native-drop-waves-per-eu": lambda: not _on_hip(),
    "native-fp8-dot-bf16-operands": lambda: not _on_hip(),
}


def _register_native_rewrites() -> None:
    """The rewrites change @triton.jit source, which Triton (compiler and interpreter alike) reads back through
    ``inspect`` from the module's file name: they take effect only where the loader makes the rewritten text what
    ``inspect`` finds for the module (a file name of its own in ``linecache``)."""
    from contracts.subjects.vllm.loader import Rewrite, register_rewrite

    register_rewrite(Rewrite(
        "native-tl-cat-dim1", _OPS,
        r"tl\.cat\((\w+), (\w+), dim=1\)",
        r"tl.reshape(tl.permute(tl.join(\1, \2), (0, 2, 1)), (\1.shape[0], 2 * \1.shape[1]))",
        "the gfx950 decode joins 2-D tiles with tl.cat(a, b, dim=1), which a Triton without tl.cat's dim argument "
        "(3.6 on NVIDIA) cannot compile; join + permute + reshape is the same concatenation along dim 1 of two "
        "equal-shape 2-D tiles (equal to torch.cat, and the dot after it, on an H200 with Triton 3.6)",
        when="native", regex=True))
    register_rewrite(Rewrite(
        "native-drop-waves-per-eu", _OPS,
        r"\bwaves_per_eu=[^,()\n]+,",
        "",
        "the gfx950 decode launch passes waves_per_eu=, an AMD occupancy hint NVIDIA's Triton rejects ('Keyword "
        "argument waves_per_eu was specified but unrecognised'); it changes no result",
        when="native", regex=True))
    register_rewrite(Rewrite(
        "native-fp8-dot-bf16-operands", _OPS,
        "s = tl.dot(kv, tl.trans(q))",
        "s = tl.dot(kv.to(tl.bfloat16), tl.trans(q).to(tl.bfloat16))",
        "the paged-logits kernel multiplies fp8 tiles with tl.dot; AMD's fp8 MFMA (gfx942, gfx950) accumulates in "
        "fp32, NVIDIA Hopper's fp8 tensor-core MMA in fewer bits (DeepSeek-V3 technical report, section 3.3.2), so "
        "natively on an H200 its head scores drift by about a bf16 rounding from what the kernel computes on its "
        "targets (the native subject audit failed indexer-logits-agreement on gfx950 so); every e4m3 value is "
        "exact in bf16, so bf16 operands with fp32 accumulation are the kernel's AMD arithmetic",
        when="native"))


def rewrites_for_host() -> list:
    """The loader's registered rewrites this host needs: ``always`` ones; ``interpreter`` ones under the
    interpreter; ``native`` ones natively (those registered here only where the host lacks what they replace)."""
    from contracts.subjects.vllm import loader

    mode = "interpreter" if interpreting() else "native"
    out = []
    for rw in loader.REWRITES:
        if rw.when not in ("always", mode):
            continue
        need = _NATIVE_NEEDS.get(rw.id)
        if mode == "native" and need is not None and not need():
            continue
        out.append(rw)
    return out


_register_native_rewrites()
