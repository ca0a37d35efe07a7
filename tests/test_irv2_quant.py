"""Cross-checks of nac_lab.irv2.quant: decoders against the gguf package bit for bit, encoders against gguf (Q8_0)
and against a scalar, loop-by-loop float32 transcription of GGML's reference quantizers (Q4_K, Q6_K)."""
import numpy as np, pytest
import gguf, gguf.quants as gq
from nac_lab.irv2.quant import quantize, dequantize, QuantError, BLOCKS
from nac_lab.binio import NacLabError

F = np.float32
GQ = {k: gguf.GGMLQuantizationType[k] for k in ('Q8_0', 'Q4_K', 'Q6_K', 'F16', 'BF16')}
SCALES = {'Q8_0': [0], 'Q4_K': [0, 2], 'Q6_K': [208]}

def bits(a): return np.asarray(a, F).view(np.uint32)

def random_raw(kind, nb, rng, special=False):
    bb = BLOCKS[kind][1]; r = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    for off in SCALES[kind]:
        h = rng.integers(0, 0x7C00,
                         nb).astype(np.uint16) | (rng.integers(0, 2, nb).astype(np.uint16) << 15)  # finite f16, incl. subnormals and -0
        if special: h[:4] = [0, 0x8000, 1, 0x7BFF]
        r[:, off:off+2] = h.view(np.uint8).reshape(nb, 2)
    return r.reshape(-1)

@pytest.mark.parametrize('kind', ['Q8_0', 'Q4_K', 'Q6_K'])
def test_dequantize_matches_gguf_on_random_blocks(kind):
    rng = np.random.default_rng({'Q8_0': 1, 'Q4_K': 2, 'Q6_K': 3}[kind])
    raw = random_raw(kind, 2048, rng, special=True); n = 2048 * BLOCKS[kind][0]
    assert np.array_equal(bits(dequantize(raw, kind, (n,))), bits(gq.dequantize(raw, GQ[kind]).reshape(-1)))

@pytest.mark.parametrize('kind', ['F16', 'BF16'])
def test_float_kinds_match_gguf(kind):
    rng = np.random.default_rng(4); raw = rng.integers(0, 256, 4096, dtype=np.uint8)
    h = raw.view(np.uint16); raw = raw.copy()
    if kind == 'F16': raw.view(np.uint16)[(h & 0x7C00) == 0x7C00] = 0x3C00          # keep finite
    else: raw.view(np.uint16)[(h & 0x7F80) == 0x7F80] = 0x3F80
    ours = dequantize(raw, kind, (2048,)); theirs = gq.dequantize(raw, GQ[kind]).reshape(-1)
    assert np.array_equal(bits(ours), bits(theirs))
    x = np.random.default_rng(5).normal(0, 10, 1024).astype(F)
    assert np.array_equal(quantize(x, kind), gq.quantize(x, GQ[kind]).reshape(-1).view(np.uint8))

@pytest.mark.parametrize('scale', [1e-30, 1e-6, 1.0, 300.0, 6e4])
def test_q8_0_quantize_matches_gguf(scale):
    rng = np.random.default_rng(int(np.log10(scale) + 40))
    x = (rng.normal(0, 1, (64, 32)) * scale).astype(F)
    x[0] = 0; x[1] = (np.arange(32) - 16) * F(0.5) * F(127 / 16)               # exact halves: roundf ties
    x[2, :] = scale; x[3] = rng.integers(-127, 128, 32).astype(F) * F(0.5)
    assert np.array_equal(quantize(x, 'Q8_0'), gq.quantize(x, GQ['Q8_0']).reshape(-1))

# --- scalar float32 transcription of GGML's reference quantizers (one element at a time, as the C code) ---
def nint(v): return int(np.rint(F(v)))

RMIN, RDELTA = F(-1), F(0.1)                      # the reference search's float32 defaults

def ref_qkx2(x, w, nmax=15, rmin=RMIN, rdelta=RDELTA, nstep=20):
    n = len(x); mn = x[0]; mx = x[0]; sw = w[0]; sx = F(sw * x[0])
    for i in range(1, n):
        mn = min(mn, x[i]); mx = max(mx, x[i]); sw = F(sw + w[i]); sx = F(sx + F(w[i] * x[i]))
    if mn > 0: mn = F(0)
    if mx == mn: return F(0), F(-mn), [0] * n
    isc = F(F(nmax) / F(mx - mn)); sc = F(F(1) / isc); L = []; best = F(0)
    for i in range(n):
        L.append(max(0, min(nmax, nint(F(isc * F(x[i] - mn))))))
        d = F(F(F(sc * F(L[i])) + mn) - x[i]); best = F(best + F(w[i] * F(d * d)))
    for s in range(nstep + 1):
        isc = F(F(F(rmin + F(rdelta * F(s))) + F(nmax)) / F(mx - mn))
        La = [max(0, min(nmax, nint(F(isc * F(x[i] - mn))))) for i in range(n)]
        sl = sl2 = sxl = F(0)
        for i in range(n):
            wl = F(w[i] * F(La[i])); sl = F(sl + wl); sl2 = F(sl2 + F(wl * F(La[i]))); sxl = F(sxl + F(wl * x[i]))
        D = F(F(sw * sl2) - F(sl * sl))
        if D > 0:
            ts = F(F(F(sw * sxl) - F(sx * sl)) / D); tm = F(F(F(sl2 * sx) - F(sl * sxl)) / D)
            if tm > 0: tm = F(0); ts = F(sxl / sl2)
            cur = F(0)
            for i in range(n):
                d = F(F(F(ts * F(La[i])) + tm) - x[i]); cur = F(cur + F(w[i] * F(d * d)))
            if cur < best: L, best, sc, mn = La, cur, ts, tm
    return sc, F(-mn), L

def ref_q4_k(x):
    x = x.astype(F); scs, mns, L = [], [], []
    for j in range(8):
        b = x[32*j:32*j+32]; s2 = F(0)
        for v in b: s2 = F(s2 + F(v * v))
        av = F(np.sqrt(F(s2 / F(32)))); w = [F(av + abs(v)) for v in b]
        sc, m, l = ref_qkx2(b, w); scs.append(sc); mns.append(m); L += l
    ms = max([F(0)] + scs); mm = max([F(0)] + mns)
    inv_s = F(F(63) / ms) if ms > 0 else F(0); inv_m = F(F(63) / mm) if mm > 0 else F(0)
    q = [0] * 12; ls_all, lm_all = [], []
    for j in range(8):
        ls = min(63, nint(F(inv_s * scs[j])) % 256); lm = min(63, nint(F(inv_m * mns[j])) % 256)   # uint8_t, then MIN
        ls_all.append(ls); lm_all.append(lm)
        if j < 4: q[j] = ls; q[j+4] = lm
        else: q[j+4] = (ls & 15) | ((lm & 15) << 4); q[j-4] |= (ls >> 4) << 6; q[j] |= (lm >> 4) << 6
    d = np.float16(F(ms / F(63))); dmin = np.float16(F(mm / F(63)))
    for j in range(8):
        dd = F(F(d) * F(ls_all[j]))
        if dd == 0: continue
        dm = F(F(dmin) * F(lm_all[j]))
        for i in range(32): L[32*j+i] = max(0, min(15, nint(F(F(x[32*j+i] + dm) / dd))))
    qs = [L[64*c + l] | (L[64*c + l + 32] << 4) for c in range(4) for l in range(32)]
    return bytes(np.array([d, dmin], np.float16).view(np.uint8)) + bytes(q) + bytes(qs)

def ref_qx(x, nmax=32):
    amax = F(0); mx = F(0)
    for v in x:
        if abs(v) > amax: amax = F(abs(v)); mx = v
    if amax < F(1e-15): return F(0), [0] * len(x)
    def run(isc):
        L = []; slx = sl2 = F(0)
        for v in x:
            l = max(-nmax, min(nmax - 1, nint(F(isc * v)))); L.append(l + nmax); w = F(v * v)
            slx = F(slx + F(F(w * v) * F(l))); sl2 = F(sl2 + F(F(w * F(l)) * F(l)))
        return L, slx, sl2
    L, slx, sl2 = run(F(F(-nmax) / mx)); sc = F(slx / sl2) if sl2 != 0 else F(0); best = F(sc * slx)
    for s in range(-9, 10):
        if s == 0: continue
        La, slx, sl2 = run(F(-F(F(nmax) + F(F(0.1) * F(s))) / mx))
        if sl2 > 0 and F(slx * slx) > F(best * sl2): L, sc = La, F(slx / sl2); best = F(sc * slx)
    return sc, L

def ref_q6_k(x):
    x = x.astype(F); scs, L = [], []
    for j in range(16):
        s, l = ref_qx(x[16*j:16*j+16]); scs.append(s); L += l
    amx = F(0); mx = F(0)
    for s in scs:
        if abs(s) > amx: amx = F(abs(s)); mx = s
    if amx < F(1e-15): return bytes(210)
    isc = F(F(-128) / mx); d = np.float16(F(F(1) / isc))
    q = [min(127, nint(F(isc * s))) for s in scs]
    for j in range(16):
        dd = F(F(d) * F(q[j]))
        if dd == 0: continue
        for i in range(16): L[16*j+i] = max(-32, min(31, nint(F(x[16*j+i] / dd)))) + 32
    ql, qh = [0] * 128, [0] * 64
    for h in range(2):
        for l in range(32):
            a, b, c, e = (L[128*h + l + 32*k] for k in range(4))
            ql[64*h + l] = (a & 15) | ((c & 15) << 4); ql[64*h + l + 32] = (b & 15) | ((e & 15) << 4)
            qh[32*h + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    return bytes(ql) + bytes(qh) + bytes(np.array(q, np.int8).view(np.uint8)) + bytes(np.array([d], np.float16).view(np.uint8))

def sample_blocks(rng, nb):
    "Gaussian, heavy-tailed, all-positive, sparse, constant and zero blocks."
    out = [rng.normal(0, 1, 256), rng.standard_t(2, 256), np.abs(rng.normal(3, 1, 256)), rng.normal(0, 1, 256) * (rng.random(256) < 0.1),
           np.full(256, 0.7), np.zeros(256), rng.normal(0, 1e-3, 256), np.r_[np.zeros(128), rng.normal(0, 1, 128)]]
    return np.array(out[:nb], F)

@pytest.mark.parametrize('kind,ref', [('Q4_K', ref_q4_k), ('Q6_K', ref_q6_k)])
def test_k_quants_match_scalar_reference(kind, ref):
    rng = np.random.default_rng(6)
    x = np.concatenate([sample_blocks(rng, 8), (rng.laplace(0, 1, (8, 256)) * 10.0 ** rng.uniform(-4, 2, (8, 1))).astype(F)])
    ours = quantize(x, kind).reshape(len(x), -1)
    for i in range(len(x)): assert bytes(ours[i]) == ref(x[i]), (kind, i)

@pytest.mark.parametrize('kind', ['Q8_0', 'Q4_K', 'Q6_K'])
def test_roundtrip_error_bounded_and_idempotent_shape(kind):
    rng = np.random.default_rng(7); x = rng.normal(0, 1, (16, 512)).astype(F)
    y = dequantize(quantize(x, kind), kind, x.shape)
    assert y.shape == x.shape and y.dtype == F
    rel = np.linalg.norm(x - y) / np.linalg.norm(x)
    assert rel < {'Q8_0': 0.01, 'Q6_K': 0.03, 'Q4_K': 0.1}[kind]
    assert not quantize(np.zeros(512), kind).any() or kind == 'Q6_K' and not dequantize(quantize(np.zeros(512), kind), kind, (512,)).any()

def test_errors_are_typed():
    with pytest.raises(QuantError, match='Q6_K: 256 elements of shape \\(256,\\) need 210 bytes, got 209'): dequantize(bytes(209), 'Q6_K',
                                                                                                                       (256,))
    with pytest.raises(QuantError, match="unsupported quantization kind 'IQ2_XS'"): quantize(np.zeros(256), 'IQ2_XS')
    with pytest.raises(NacLabError): quantize(np.full(256, np.nan), 'Q4_K')
