"""The Python package on the CPU backend: every registered op against a float64 reference on fresh
random data, fused against unfused bit for bit, and every argument check with the message it gives."""
import re

import numpy as np
import pytest

import tilelink
from reference import reference

OPS = [s["name"] for s in tilelink.ops()]
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3}


def operands(op, world, rng, dtype, m=37, n=24, k=40, ragged=True):
    """Rank r's A_r, B_r as the op splits them (ragged, one rank empty where the op allows)."""
    if op == "ag_gemm":  # A_r [M_r, K], B_r [N_r, K]
        rows = [0 if (ragged and r == 1) else m // world + r for r in range(world)]
        cols = [n // world + (r % 3 if ragged else 0) + 1 for r in range(world)]
        a = [rng.uniform(-1, 1, (rows[r], k)).astype(dtype) for r in range(world)]
        b = [rng.uniform(-1, 1, (cols[r], k)).astype(dtype) for r in range(world)]
    else:  # A_r [M, K_r], B_r [N, K_r]
        ks = [8 * (1 + (r % 3 if ragged else 0)) for r in range(world)]
        a = [rng.uniform(-1, 1, (m, ks[r])).astype(dtype) for r in range(world)]
        b = [rng.uniform(-1, 1, (n, ks[r])).astype(dtype) for r in range(world)]
    return a, b


def rel_err(got, want):
    den = np.linalg.norm(want)
    return np.linalg.norm(got.astype(np.float64) - want) / (den if den > 0 else 1.0)


def test_ops_listed():
    assert OPS == ["ag_gemm", "gemm_rs", "gemm_ar"]
    for spec in tilelink.ops():
        assert spec["split"] in ("n", "k") and spec["summary"] and isinstance(spec["variants"], list)
        assert hasattr(tilelink.World, spec["name"])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_op_matches_reference(op, world, dtype):
    rng = np.random.default_rng(hash((op, world, str(dtype))) % 2**32)
    w = tilelink.virtual(world=world, backend="cpu")
    for call in range(2):  # a made op is reused: fresh inputs on the second call
        a, b = operands(op, world, rng, dtype)
        want = reference(op, a, b)
        poisoned = [np.full(x.shape, np.nan, dtype=dtype) for x in want]
        fused = getattr(w, op)(a, b, path="fused", out=poisoned)
        assert fused is not None and all(f is p for f, p in zip(fused, poisoned))
        unfused = getattr(w, op)(a, b, path="unfused")
        assert w.last_path[0] == "unfused"
        for r in range(world):
            assert fused[r].shape == want[r].shape and fused[r].dtype == dtype
            assert not np.isnan(fused[r]).any(), f"rank {r}: unwritten output"
            assert rel_err(fused[r], want[r]) < TOLERANCE[dtype], f"call {call}, rank {r}"
            np.testing.assert_array_equal(fused[r], unfused[r])


@pytest.mark.parametrize("op,variants", [("ag_gemm", ["pull", "push"]), ("gemm_rs", ["pull", "push"]),
                                         ("gemm_ar", ["one-shot", "two-shot"])])
def test_variants_and_config(op, variants):
    rng = np.random.default_rng(7)
    w = tilelink.virtual(world=3, backend="cpu")
    a, b = operands(op, 3, rng, np.float32)
    want = reference(op, a, b)
    for v in variants:
        cfg = tilelink.Config(variant=v, comm_tile=5, tile_m=16, tile_n=8, comm_workers=2, compute_workers=3)
        c = w.run(op, a, b, config=cfg)
        for r in range(3):
            assert rel_err(c[r], want[r]) < 1e-5, f"{v}, rank {r}"
    assert "M=" in w.config(op, a, b)


@pytest.mark.parametrize("op", ["gemm_rs", "gemm_ar"])
def test_m_split(op):
    rng = np.random.default_rng(3)
    w = tilelink.virtual(world=4, backend="cpu")
    a, b = operands(op, 4, rng, np.float32)
    split = [20, 0, 1, 16]
    want = reference(op, a, b, m_split=split)
    c = w.run(op, a, b, config=tilelink.Config(m_split=split, variant="two-shot" if op == "gemm_ar" else "auto"))
    for r in range(4):
        assert c[r].shape == want[r].shape
        assert rel_err(c[r], want[r]) < 1e-5


def raises(exc, pattern, fn):
    with pytest.raises(exc, match=re.escape(pattern)):
        fn()


def test_refusals():
    rng = np.random.default_rng(5)
    w = tilelink.virtual(world=3, backend="cpu")
    a, b = operands("gemm_rs", 3, rng, np.float32, ragged=False)
    ok_out = [np.empty(s, np.float32) for s in [(13, 24), (12, 24), (12, 24)]]
    w.gemm_rs(a, b, out=ok_out)  # the reference call: every case below changes one thing
    raises(ValueError, "a holds 2 arrays, the world has 3 ranks", lambda: w.gemm_rs(a[:2], b))
    raises(ValueError, "b holds 4 arrays", lambda: w.gemm_rs(a, b + b[:1]))
    raises(TypeError, "b must be a list of arrays, one per rank, got int", lambda: w.gemm_rs(a, 5))
    raises(TypeError, "a[1] is not an array", lambda: w.gemm_rs([a[0], "x", a[2]], b))
    raises(TypeError, "a[0] has dtype float64; tilelink takes float32, float16 or bfloat16",
           lambda: w.gemm_rs([x.astype(np.float64) for x in a], b))
    raises(TypeError, "b[2] has dtype fp16, a[0] has fp32",
           lambda: w.gemm_rs(a, b[:2] + [b[2].astype(np.float16)]))
    raises(TypeError, "a[0] has dtype int32", lambda: w.gemm_rs([x.astype(np.int32) for x in a], b))
    raises(ValueError, "a[1] has 3 dimensions", lambda: w.gemm_rs([a[0], a[1][None], a[2]], b))
    raises(ValueError, "a[0] [37, 8] has strides (1, 37) elements; operands must be row-major and dense",
           lambda: w.gemm_rs([np.asfortranarray(a[0])] + a[1:], b))
    raises(ValueError, "a[2] [37, 8] has strides (16, 2)",
           lambda: w.gemm_rs(a[:2] + [np.empty((37, 16), np.float32)[:, ::2]], b))
    raises(ValueError, "gemm_rs: b[1] [24, 4] has K_r = 4, a[1] [37, 8] has K_r = 8",
           lambda: w.gemm_rs(a, [b[0], b[1][:, :4].copy(), b[2]]))
    raises(ValueError, "gemm_rs: a[2] [36, 8] has M = 36, a[0] has M = 37",
           lambda: w.gemm_rs(a[:2] + [a[2][:36].copy()], b))
    raises(ValueError, "gemm_rs: b[1] [23, 8] has N = 23, b[0] has N = 24",
           lambda: w.gemm_rs(a, [b[0], b[1][:23].copy(), b[2]]))
    raises(ValueError, "gemm_rs: m_split adds up to 36, M is 37",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(m_split=[12, 12, 12])))
    raises(ValueError, "gemm_rs: m_split has 2 counts for 3 ranks",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(m_split=[30, 7])))
    raises(ValueError, "gemm_rs: variant must be one of 'auto', 'pull', 'push', got 'one-shot'",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(variant="one-shot")))
    raises(ValueError, "path must be 'auto', 'fused' or 'unfused', got 'fast'", lambda: w.gemm_rs(a, b, path="fast"))
    raises(TypeError, "path must be a str", lambda: w.gemm_rs(a, b, path=1))
    raises(TypeError, "config must be a tilelink.Config", lambda: w.gemm_rs(a, b, config={"variant": "pull"}))
    raises(TypeError, "Config.comm_tile must be an int, got float",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(comm_tile=1.5)))
    raises(ValueError, "comm_workers must be in [1, 1024], got 0",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(comm_workers=0)))
    raises(ValueError, "tile_m must be in [1, 1048576], got -3",
           lambda: w.gemm_rs(a, b, config=tilelink.Config(tile_m=-3)))
    raises(ValueError, "no op 'gemm'; the ops are ag_gemm, gemm_rs, gemm_ar", lambda: w.run("gemm", a, b))
    # outputs
    raises(ValueError, "out[1] is [13, 24], gemm_rs writes [12, 24] on rank 1",
           lambda: w.gemm_rs(a, b, out=[ok_out[0], ok_out[0].copy(), ok_out[2]]))
    raises(TypeError, "out[2] has dtype fp16, a[0] has fp32",
           lambda: w.gemm_rs(a, b, out=ok_out[:2] + [ok_out[2].astype(np.float16)]))
    raises(ValueError, "out[1] shares memory with out[0]",
           lambda: w.gemm_rs(a, b, out=[ok_out[0], ok_out[0][1:], ok_out[2]]))
    buf = np.zeros(37 * 8 + 13 * 24, np.float32)  # a[0] and out[0] overlapping in one buffer
    a0, out0 = buf[:37 * 8].reshape(37, 8), buf[100:100 + 13 * 24].reshape(13, 24)
    raises(ValueError, "out[0] shares memory with the input a[0]",
           lambda: w.gemm_rs([a0] + a[1:], b, out=[out0] + ok_out[1:]))
    read_only = ok_out[1].copy()
    read_only.flags.writeable = False
    raises(TypeError, "out[1] is not a writable array", lambda: w.gemm_rs(a, b, out=[ok_out[0], read_only, ok_out[2]]))
    # ag_gemm's own shapes
    ag_a, ag_b = operands("ag_gemm", 3, rng, np.float32)
    raises(ValueError, "ag_gemm: b[1] [10, 39] has K = 39, a[0] has K = 40",
           lambda: w.ag_gemm(ag_a, [ag_b[0], ag_b[1][:, :39].copy(), ag_b[2]]))
    raises(ValueError, "ag_gemm: b[2] [0, 40] has no rows", lambda: w.ag_gemm(ag_a, ag_b[:2] + [ag_b[2][:0]]))
    raises(ValueError, "m_split is for ops whose K is split",
           lambda: w.ag_gemm(ag_a, ag_b, config=tilelink.Config(m_split=[1, 1, 1])))
    # worlds
    raises(ValueError, "world must be in [1, 64], got 0", lambda: tilelink.virtual(world=0, backend="cpu"))
    raises(ValueError, "world must be in [1, 64], got 65", lambda: tilelink.virtual(world=65, backend="cpu"))
    raises(ValueError, "backend must be 'cpu' or 'cuda', got 'tpu'", lambda: tilelink.virtual(world=2, backend="tpu"))
    raises(ValueError, "timeout must be in (0, 86400] seconds", lambda: tilelink.virtual(2, backend="cpu", timeout=0))
    # after every refusal the world still runs
    c = w.gemm_rs(a, b)
    want = reference("gemm_rs", a, b)
    assert all(rel_err(c[r], want[r]) < 1e-5 for r in range(3))


def test_cuda_backend_without_cuda():
    if tilelink.has_cuda:
        pytest.skip("this build holds the CUDA backend: tests/python/test_cuda.py covers it")
    raises(tilelink.Error, "this tilelink was built without CUDA", lambda: tilelink.virtual(2, backend="cuda"))
    assert tilelink.virtual(2).backend == "cpu"  # auto
    assert issubclass(tilelink.TimeoutError, tilelink.Error) and issubclass(tilelink.Error, RuntimeError)
    raises(tilelink.Error, "tilelink.init: this tilelink was built without CUDA", tilelink.init)


def test_process_world_before_init():
    """The module-level ops run on init()'s world; before it they say so."""
    x = np.zeros((4, 4), np.float32)
    for call in (lambda: tilelink.ag_gemm(x, x), lambda: tilelink.gemm_rs(x, x), lambda: tilelink.gemm_ar(x, x),
                 tilelink.world):
        raises(RuntimeError, "tilelink.init() has not been called", call)
    for name in OPS:
        assert callable(getattr(tilelink, name))


def test_closed_world():
    w = tilelink.virtual(2, backend="cpu")
    a, b = operands("gemm_ar", 2, np.random.default_rng(5), np.float32)
    w.gemm_ar(a, b)
    w.close()
    w.close()  # twice is fine
    raises(tilelink.Error, "this tilelink world is closed", lambda: w.gemm_ar(a, b))


def test_readme_example():
    """The README's Python examples of one process (ops, attention, MoE) run as written, in order."""
    import pathlib
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    local = [b for b in blocks if "tilelink.init()" not in b]
    assert len(local) == 3, len(local)
    scope = {}
    for block in local:
        exec(compile(block, "README.md", "exec"), scope)
    assert [y.shape for y in scope["y"]] == [(100, 64), (60, 64)]


def test_raw_operand_tuples():
    """The torch fast path's operand tuples (data_ptr, dim, shape, strides, dtype code or name,
    device index) give the same results and the same refusals as the arrays themselves."""
    rng = np.random.default_rng(11)
    w = tilelink.virtual(world=2, backend="cpu")
    a, b = operands("gemm_ar", 2, rng, np.float32)
    want = reference("gemm_ar", a, b)
    out = [np.full(x.shape, np.nan, np.float32) for x in want]

    def raw(x, dtype=0, device=-1):
        return (x.ctypes.data, x.ndim, x.shape, tuple(s // x.itemsize for s in x.strides), dtype, device)

    knobs = tilelink.Config()._knobs("fused")
    assert w._w.run("gemm_ar", [raw(x) for x in a], [raw(y) for y in b], [raw(o) for o in out], knobs, 0, True) == 1
    assert w.last_path is None and w._w.last_why.startswith("the CPU backend runs the fused op")
    for r in range(2):
        assert rel_err(out[r], want[r]) < 1e-5
    raises(TypeError, "a[1] has dtype float64; tilelink takes",
           lambda: w._w.run("gemm_ar", [raw(a[0]), raw(a[1], "torch.float64")], [raw(y) for y in b],
                            [raw(o) for o in out], knobs, 0, True))
    raises(TypeError, "b[0] is on cuda:0; this world's operands must be on cpu",
           lambda: w._w.run("gemm_ar", [raw(x) for x in a], [raw(b[0], device=0), raw(b[1])],
                            [raw(o) for o in out], knobs, 0, True))
    raises(TypeError, "out[1] is not a writable array",
           lambda: w._w.run("gemm_ar", [raw(x) for x in a], [raw(y) for y in b], [raw(out[0]), out[1]], knobs, 0, True))


@pytest.mark.parametrize("world", [1, 3, 4])
def test_tp_mlp_example(world):
    """examples/python/tp_mlp_virtual.py (ag_gemm, SiLU-and-mul, gemm_rs) matches float64."""
    import pathlib
    import subprocess
    import sys
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "tp_mlp_virtual.py"
    r = subprocess.run([sys.executable, str(example), "--world", str(world), "--backend", "cpu", "--tokens", "77",
                        "--ffn", str(8 * world * 3), "--iters", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and ": OK" in r.stdout, r.stdout + r.stderr


# ---- sequence-parallel attention ----------------------------------------------------------------

def attention_reference(q, k, v, causal):
    """float64 attention of the whole sequence (position order): q [B, S, Hq, D], k and v [B, S,
    Hkv, D]; returns O [B, S, Hq, D] and lse [B, S, Hq]."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, s, hq, d = q.shape
    g = hq // k.shape[2]
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(d)
    if causal:
        scores[:, :, np.triu(np.ones((s, s), bool), 1)] = -np.inf
    m = scores.max(-1, keepdims=True)
    p = np.exp(scores - m)
    l = p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p / l, vv)
    return o, (m + np.log(l))[..., 0].transpose(0, 2, 1)


def shard_positions(seq, world, shard, segments=None):
    """Rank r's positions in shard order (ops/attention_plan.hpp's SeqSharding)."""
    def even(n, parts):
        base, extra = divmod(n, parts)
        sizes = [base + (1 if i < extra else 0) for i in range(parts)]
        return np.cumsum([0] + sizes)
    if shard == "contiguous":
        ends = np.cumsum([0] + list(segments))
        return [np.arange(ends[r], ends[r + 1]) for r in range(world)]
    c = even(seq, 2 * world)
    return [np.concatenate([np.arange(c[r], c[r + 1]), np.arange(c[2 * world - 1 - r], c[2 * world - r])])
            for r in range(world)]


@pytest.mark.parametrize("op", ["sp_attn", "ring_attn"])
@pytest.mark.parametrize("world,shard,causal", [(1, "contiguous", True), (3, "contiguous", False),
                                                (3, "zigzag", True), (4, "contiguous", True), (2, "zigzag", False)])
def test_attention_matches_float64(op, world, shard, causal):
    """sp_attn and ring_attn on the CPU backend: every rank's output and lse against float64
    attention over the whole sequence (ragged contiguous shards with an empty one, zigzag), fused
    and unfused bit for bit, outputs poisoned first."""
    rng = np.random.default_rng(7 + world)
    seq, batch, hq, hkv, d = 97, 2, 4, 2, 16
    segments = [seq // world + (r % 2) * 3 - (1 if r == world - 1 and world % 2 == 0 else 0) for r in range(world)]
    segments[-1] = seq - sum(segments[:-1])
    if world >= 3:
        segments[1], segments[0] = 0, segments[0] + segments[1]  # an empty shard
    pos = shard_positions(seq, world, shard, segments)
    q = rng.uniform(-1, 1, (batch, seq, hq, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (batch, seq, hkv, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (batch, seq, hkv, d)).astype(np.float32)
    want_o, want_lse = attention_reference(q, k, v, causal)
    qs = [np.ascontiguousarray(q[:, p]) for p in pos]
    ks = [np.ascontiguousarray(k[:, p]) for p in pos]
    vs = [np.ascontiguousarray(v[:, p]) for p in pos]
    w = tilelink.virtual(world, backend="cpu")
    results = []
    for path in ("fused", "unfused"):
        out = [np.full(x.shape, np.nan, np.float32) for x in qs]
        lse = [np.full(x.shape[:3], np.nan, np.float32) for x in qs]
        got_o, got_lse = getattr(w, op)(qs, ks, vs, causal=causal, shard=shard, path=path, out=out, lse=lse)
        assert got_o is out and got_lse is lse
        assert w.last_path[0] == path
        for r in range(world):
            assert rel_err(out[r], want_o[:, pos[r]]) < 1e-5, (path, r)
            np.testing.assert_allclose(lse[r], want_lse[:, pos[r]], atol=1e-4)
        results.append([x.copy() for x in out + lse])
    for a, b in zip(*results):
        assert np.array_equal(a, b, equal_nan=True)
    # outputs allocated when not given
    o2, l2 = getattr(w, op)(qs, ks, vs, causal=causal, shard=shard)
    for r in range(world):
        assert o2[r].shape == qs[r].shape and l2[r].dtype == np.float32
        assert rel_err(o2[r], want_o[:, pos[r]]) < 1e-5


def test_attention_refuses_bad_arguments():
    w = tilelink.virtual(2, backend="cpu")
    rng = np.random.default_rng(3)
    q = [rng.uniform(-1, 1, (1, n, 4, 8)).astype(np.float32) for n in (5, 6)]
    k = [rng.uniform(-1, 1, (1, n, 2, 8)).astype(np.float32) for n in (5, 6)]
    raises(TypeError, "q must be a list of arrays, one per rank, got ndarray", lambda: w.sp_attn(q[0], k, k))
    raises(ValueError, "k holds 1 arrays, the world has 2 ranks", lambda: w.sp_attn(q, k[:1], k))
    raises(ValueError, "k[1] is [1, 6, 2, 4], not [1, 6, 2, 8]",
           lambda: w.sp_attn(q, [k[0], np.zeros((1, 6, 2, 4), np.float32)], k))
    raises(ValueError, "v[0] has 3 dimensions, not 4", lambda: w.sp_attn(q, k, [k[0][0], k[1]]))
    raises(TypeError, "k[0] has dtype fp16, q[0] has fp32",
           lambda: w.sp_attn(q, [k[0].astype(np.float16), k[1]], k))
    raises(ValueError, "q[1] is not row-major and dense",
           lambda: w.ring_attn([q[0], np.asfortranarray(q[1])], k, k))
    raises(ValueError, "shard must be 'contiguous' or 'zigzag', got 'ring'", lambda: w.sp_attn(q, k, k, shard="ring"))
    raises(ValueError, "path must be 'auto', 'fused' or 'unfused', got 'best'", lambda: w.sp_attn(q, k, k, path="best"))
    q65 = [np.zeros((1, n, 4, 8), np.float32) for n in (6, 5)]
    k65 = [np.zeros((1, n, 2, 8), np.float32) for n in (6, 5)]
    raises(ValueError, "q[0] holds 6 positions; zigzag shards of S = 11 over 2 ranks give rank 0 5",
           lambda: w.sp_attn(q65, k65, k65, shard="zigzag"))
    raises(ValueError, "lse[1] is [1, 6, 2], not [1, 6, 4]",
           lambda: w.sp_attn(q, k, k, lse=[np.zeros((1, 5, 4), np.float32), np.zeros((1, 6, 2), np.float32)]))
    raises(ValueError, "the attention ops are 'sp_attn' and 'ring_attn'",
           lambda: w._w.attention("attn", q, k, k, q, None, False, "contiguous", "auto", 0))
    raises(ValueError, "out[1] shares memory with the input q[1]", lambda: w.sp_attn(q, k, k, out=[np.empty_like(q[0]), q[1]]))
    shared = np.zeros((1, 6, 4), np.float32)
    raises(ValueError, "lse[1] shares memory with lse[0]",
           lambda: w.ring_attn(q, k, k, lse=[shared[:, :5], shared]))
    bad_heads = [rng.uniform(-1, 1, (1, n, 3, 8)).astype(np.float32) for n in (5, 6)]
    with pytest.raises(ValueError, match="multiple"):
        w.sp_attn(q, bad_heads, bad_heads)


# ---- MoE layers ---------------------------------------------------------------------------------

def moe_operands(world, rng, dtype, tokens=(9, 0, 14, 7), hidden=24, ffn=(8, 16, 8, 24), experts=5, topk=2,
                 gated=False):
    """Rank r's tokens, routing and expert shards: x[r] [M_r, H], ids / weights [M_r, topk], w1[r]
    [E, F_r (x2 gated), H], w2[r] [E, H, F_r]. Expert experts - 1 gets no token."""
    m, f = tokens[:world], ffn[:world]
    x = [rng.uniform(-1, 1, (n, hidden)).astype(dtype) for n in m]
    ids = [np.stack([rng.choice(experts - 1, topk, replace=False) for _ in range(n)]).astype(np.int32)
           if n else np.zeros((0, topk), np.int32) for n in m]
    wts = [rng.uniform(0, 1, (n, topk)).astype(np.float32) for n in m]
    w1 = [rng.uniform(-0.5, 0.5, (experts, (2 if gated else 1) * fr, hidden)).astype(dtype) for fr in f]
    w2 = [rng.uniform(-0.5, 0.5, (experts, hidden, fr)).astype(dtype) for fr in f]
    return x, ids, wts, w1, w2


def grouped_order(ids):
    """The pairs p = token * topk + slot in grouped order (ops/moe_routing.hpp)."""
    return np.argsort(ids.ravel(), kind="stable")


def moe_layer0_reference(xs, ids, w1):
    """float64: [M * topk, F] rows X[token] W1[expert]^T in grouped order."""
    x, flat = np.concatenate(xs).astype(np.float64), ids.ravel()
    order, topk = grouped_order(ids), ids.shape[1]
    return np.stack([x[p // topk] @ w1[flat[p]].astype(np.float64).T for p in order])


def moe_partial_reference(h1, ids, wts, w2):
    """float64: the top-k reduce of h1 W2^T, [M, H] (h1 in grouped order)."""
    flat, order, topk = ids.ravel(), grouped_order(ids), ids.shape[1]
    y = np.stack([h1[i].astype(np.float64) @ w2[flat[p]].astype(np.float64).T for i, p in enumerate(order)])
    row_of_pair = np.empty_like(order)
    row_of_pair[order] = np.arange(order.size)
    return np.stack([sum(wts[t, s] * y[row_of_pair[t * topk + s]] for s in range(topk)) for t in range(ids.shape[0])])


@pytest.mark.parametrize("world,dtype", [(1, np.float32), (3, np.float32), (4, np.float16), (2, np.float16)])
def test_moe_layers_match_float64(world, dtype):
    """moe_ag_gemm, moe_gemm_rs and moe_mlp on the CPU backend against float64 (ragged tokens with an
    empty rank, ragged F_r, an expert with no token), fused and unfused bit for bit, outputs
    poisoned first; layer 0's output feeds layer 1."""
    rng = np.random.default_rng(11 + world)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    x, ids, wts, w1, w2 = moe_operands(world, rng, dtype)
    all_ids, all_wts = np.concatenate(ids), np.concatenate(wts)
    m = [t.shape[0] for t in x]
    ends = np.cumsum([0] + m)
    w = tilelink.virtual(world, backend="cpu")

    def both(call, shapes):
        got = []
        for path in ("fused", "unfused"):
            out = [np.full(s, np.nan, dtype) for s in shapes]
            assert call(path, out) is out and w.last_path[0] == path
            got.append(out)
        for a, b in zip(*got):
            assert np.array_equal(a, b)
        return got[0]

    rows = all_ids.size
    h1 = both(lambda path, out: w.moe_ag_gemm(x, ids, wts, w1, path=path, out=out),
              [(rows, f.shape[1]) for f in w1])
    for r in range(world):
        assert rel_err(h1[r], moe_layer0_reference(x, all_ids, w1[r])) < tol, r
    ids_every, wts_every = [all_ids] * world, [all_wts] * world
    c = both(lambda path, out: w.moe_gemm_rs(h1, ids_every, wts_every, w2, path=path, out=out),
             [(n, x[0].shape[1]) for n in m])
    partial = sum(moe_partial_reference(h1[r], all_ids, all_wts, w2[r]) for r in range(world))
    for r in range(world):
        assert c[r].shape == (m[r], x[0].shape[1])
        if m[r]:
            assert rel_err(c[r], partial[ends[r]:ends[r + 1]]) < tol, r
    # outputs allocated when not given; m_split gives the split
    c2 = w.moe_gemm_rs(h1, ids_every, wts_every, w2)
    assert [t.shape[0] for t in c2] == [sum(m) // world + (1 if r < sum(m) % world else 0) for r in range(world)]
    c3 = w.moe_gemm_rs(h1, ids_every, wts_every, w2, m_split=m)
    for a, b in zip(c3, c):
        assert np.array_equal(a, b)

    # the whole layer: SiLU(gate) * up between the layers
    x, ids, wts, w1, w2 = moe_operands(world, rng, dtype, gated=True)
    all_ids, all_wts = np.concatenate(ids), np.concatenate(wts)
    out = both(lambda path, out: w.moe_mlp(x, ids, wts, w1, w2, path=path, out=out), [t.shape for t in x])
    want = 0
    for r in range(world):
        gate_up = moe_layer0_reference(x, all_ids, w1[r])
        f = w2[r].shape[2]
        act = gate_up[:, :f] / (1 + np.exp(-gate_up[:, :f])) * gate_up[:, f:]
        want = want + moe_partial_reference(act.astype(dtype), all_ids, all_wts, w2[r])
    for r in range(world):
        if m[r]:
            assert rel_err(out[r], want[ends[r]:ends[r + 1]]) < (1e-5 if dtype == np.float32 else 2e-2), r
    assert [t.shape for t in w.moe_mlp(x, ids, wts, w1, w2)] == [t.shape for t in x]


def test_moe_refuses_bad_arguments():
    rng = np.random.default_rng(4)
    w = tilelink.virtual(2, backend="cpu")
    x, ids, wts, w1, w2 = moe_operands(2, rng, np.float32, tokens=(6, 5), ffn=(8, 16), gated=True)
    w.moe_mlp(x, ids, wts, w1, w2)  # the reference call: every case below changes one thing
    raises(TypeError, "x must be a list of arrays, one per rank, got ndarray", lambda: w.moe_mlp(x[0], ids, wts, w1, w2))
    raises(ValueError, "w2 holds 1 arrays, the world has 2 ranks", lambda: w.moe_mlp(x, ids, wts, w1, w2[:1]))
    raises(TypeError, "topk_ids[1] has dtype int64; routing ids are int32",
           lambda: w.moe_mlp(x, [ids[0], ids[1].astype(np.int64)], wts, w1, w2))
    raises(TypeError, "topk_weights[0] has dtype fp16, topk_weights must be fp32",
           lambda: w.moe_mlp(x, ids, [wts[0].astype(np.float16), wts[1]], w1, w2))
    raises(ValueError, "topk_ids[1] is [5, 3], not [5, 2]",
           lambda: w.moe_mlp(x, [ids[0], np.zeros((5, 3), np.int32)], wts, w1, w2))
    raises(ValueError, "w1[1] is [5, 31, 24]; it must be [5, 2 F_r, 24]",
           lambda: w.moe_mlp(x, ids, wts, [w1[0], np.ascontiguousarray(w1[1][:, :31])], w2))
    raises(ValueError, "w2[0] is [5, 24, 9], not [5, 24, 8]",
           lambda: w.moe_mlp(x, ids, wts, w1, [np.zeros((5, 24, 9), np.float32), w2[1]]))
    raises(ValueError, "out[1] is [6, 24], not [5, 24]",
           lambda: w.moe_mlp(x, ids, wts, w1, w2, out=[np.empty((6, 24), np.float32)] * 2))
    raises(ValueError, "topk = 2 is more than the 1 experts",
           lambda: w.moe_mlp(x, ids, wts, [t[:1].copy() for t in w1], [t[:1].copy() for t in w2]))
    raises(ValueError, "path must be 'auto', 'fused' or 'unfused', got 'fast'",
           lambda: w.moe_mlp(x, ids, wts, w1, w2, path="fast"))
    bad = [ids[0].copy(), ids[1]]
    bad[0][3, 1] = 7
    raises(tilelink.Error, "token 3", lambda: w.moe_mlp(x, bad, wts, w1, w2))
    h1 = w.moe_ag_gemm(x, ids, wts, [np.ascontiguousarray(t[:, :8 * (i + 1)]) for i, t in enumerate(w1)])
    every = np.concatenate(ids)
    raises(ValueError, "the outputs hold 10 rows in all, the routing has 11 tokens",
           lambda: w.moe_gemm_rs(h1, [every] * 2, [np.concatenate(wts)] * 2, w2, m_split=[5, 5]))
    raises(ValueError, "h1[1] is [22, 8], not [22, 16]",
           lambda: w.moe_gemm_rs([h1[0], h1[1][:, :8].copy()], [every] * 2, [np.concatenate(wts)] * 2, w2))
