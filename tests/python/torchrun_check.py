"""The Python package under torchrun: one process per rank, tilelink.init over torch.distributed.

    torchrun --nproc-per-node 2 tests/python/torchrun_check.py

Every rank builds every rank's operands from one seed (so it holds the whole float64 reference
without communicating) and checks its own output of every registered op, fused and unfused, into
poisoned outputs; then a CUDA-graph capture replayed on fresh inputs, sequence-parallel attention
and the MoE layers on each rank's shard, the refusals of ranks that disagree (another option,
another K) on every rank, the host time a call adds over the C++ enqueue, and last a fault: rank 0
refuses its own operand while the others call, and their calls must stop, naming rank 0, long
before the timeout. Ranks may share a GPU (more processes than GPUs): the ops then run correctly
but slowly (the GPU time-slices the processes' spinning kernels). Exits non-zero on any failure;
rank 0 prints the summary.
"""
import faulthandler
import os
import re
import statistics
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilelink  # noqa: E402
from reference import reference  # noqa: E402

failures = []
T0 = time.perf_counter()


def step(what):
    """Where the check is, with the time since the start (a hang shows where)."""
    print(f"rank {dist.get_rank()}: {time.perf_counter() - T0:7.2f} s: {what}", flush=True)
# The calls of the overhead and fault tests: fused with the comm program on SMs, whose waits are all
# device waits (the copy engine's stream waits cannot poll the stop words).
SM_FUSED = {"path": "fused", "config": tilelink.Config(comm_sms=16)}


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"rank {dist.get_rank()}: FAIL {what}", flush=True)


def operands(op, world, seed, m=384, n=256, k=192):
    """Every rank's bf16 A_r, B_r on the CPU (ragged; rank 1 without rows for ag_gemm)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(rows, cols):
        return (torch.rand(rows, cols, generator=gen) * 2 - 1).to(torch.bfloat16)
    if op == "ag_gemm":
        rows = [m // world + (m // world if r == 0 else 0) - (m // world if r == 1 else 0) for r in range(world)]
        cols = [n // world + 8 * (r % 2) for r in range(world)]
        return [rand(rows[r], k) for r in range(world)], [rand(cols[r], k) for r in range(world)]
    ks = [k // world + 8 * (r % 2) for r in range(world)]
    return [rand(m, ks[r]) for r in range(world)], [rand(n, ks[r]) for r in range(world)]


def rel_err(got, want):
    got = got.double().cpu().numpy()
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def expect(exc, pattern, fn, what):
    try:
        fn()
    except exc as e:
        check(re.search(pattern, str(e)) is not None, f"{what}: message {str(e)!r} lacks {pattern!r}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}")
        return
    check(False, f"{what}: nothing raised")


def refuse_disagreeing_ranks(rank, dev):
    """Ranks that disagree are refused on every rank, naming the rank and the field."""
    a, b = operands("ag_gemm", dist.get_world_size(), seed=3)
    tile = 64 if rank == 0 else 128
    expect(ValueError, r"rank [01] calls with another comm_tile than rank [01]",
           lambda: tilelink.ag_gemm(a[rank].to(dev), b[rank].to(dev), path="fused",
                                    config=tilelink.Config(comm_tile=tile)), "ranks with other options")
    k = 192 if rank != 1 else 200
    expect(ValueError, r"ag_gemm: a\[1\] \[64, 200\] has K = 200, a\[0\] has K = 192",
           lambda: tilelink.ag_gemm(torch.zeros(64, k, dtype=torch.bfloat16, device=dev),
                                    torch.zeros(64, k, dtype=torch.bfloat16, device=dev)), "ranks with another K")


def stop_on_a_local_refusal(rank, size, dev):
    """Rank 0 passes an fp16 operand (refused on rank 0 alone) while its peers call with good
    operands of a problem already made (no exchange): rank 0 raises TypeError naming `a` and stops
    its peers, whose waits must raise tilelink.TimeoutError naming rank 0, long before the 30 s
    timeout. Returns the slowest rank's seconds from its call to its error. Leaves the world unusable."""
    a, b = operands("gemm_ar", size, seed=11)
    good_a, good_b = a[rank].to(dev), b[rank].to(dev)
    dist.all_reduce(torch.zeros(1))  # every rank here (gloo, host)
    t0 = time.perf_counter()
    if rank == 0:
        expect(TypeError, r"^a has dtype fp16; the CUDA backend's ops take bfloat16",
               lambda: tilelink.gemm_ar(good_a.half(), good_b.half(), **SM_FUSED), "rank 0's local refusal")
    else:
        def call_and_wait():
            tilelink.gemm_ar(good_a, good_b, **SM_FUSED)
            tilelink.world().synchronize()
        expect(tilelink.TimeoutError, r"rank 0 stopped the world", call_and_wait, f"rank {rank} stopped by rank 0")
    step(f"fault: raised after {time.perf_counter() - t0:.3f} s")
    took = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    check(took.item() < 10.0, f"the peers stopped after {took.item():.2f} s (bound 10 s, timeout 30 s)")
    return float(took.item())


def attention_and_moe(rank, size, dev):
    """The ops outside the registry on this rank's operands: sp_attn and ring_attn (ragged
    contiguous shards, then zigzag, causal, GQA) and the MoE layers (ragged tokens and F_r), each
    against float64 of the whole problem, fused against unfused bit for bit."""
    import test_cpu  # the float64 attention and MoE references, the shards' positions
    gen = torch.Generator().manual_seed(5)
    seq, batch, hq, hkv, d = 96 * size + 40, 1, 8, 2, 128
    q, k, v = ((torch.rand(batch, seq, h, d, generator=gen) * 2 - 1).to(torch.bfloat16) for h in (hq, hkv, hkv))
    want_o, want_lse = test_cpu.attention_reference(*(x.double().numpy() for x in (q, k, v)), True)
    segments = [96 + (40 if r == 0 else 0) for r in range(size)]
    for shard in ("contiguous", "zigzag"):
        pos = test_cpu.shard_positions(seq, size, shard, segments)[rank]
        mq, mk, mv = (x[:, torch.as_tensor(pos)].contiguous().to(dev) for x in (q, k, v))
        for op in ("sp_attn", "ring_attn"):
            got = {}
            for path in ("fused", "unfused"):
                out = torch.full_like(mq, float("nan"))
                o, lse = getattr(tilelink, op)(mq, mk, mv, causal=True, shard=shard, path=path, out=out)
                torch.cuda.synchronize()
                tilelink.world().synchronize()
                got[path] = o
                err = float(np.abs(o.double().cpu().numpy() - want_o[:, pos]).max())
                check(o is out and err < 2e-2, f"{op} {shard} {path}: max error {err:.2e} against float64")
                lse_err = float(np.abs(lse.cpu().numpy() - want_lse[:, pos]).max())
                check(lse_err < 2e-3, f"{op} {shard} {path}: lse error {lse_err:.2e}")
            check(torch.equal(got["fused"], got["unfused"]), f"{op} {shard}: fused differs from unfused")

    rng = np.random.default_rng(9)
    tokens = tuple(48 + 24 * r for r in range(size))
    ffn = tuple(64 + 32 * (r % 2) for r in range(size))
    x, ids, wts, w1, w2 = test_cpu.moe_operands(size, rng, np.float32, tokens=tokens, hidden=256, ffn=ffn, experts=6,
                                                topk=2, gated=True)
    bf = [[torch.as_tensor(t).to(torch.bfloat16) for t in ts] for ts in (x, w1, w2)]
    xr, w1r, w2r = ([t.float().numpy() for t in ts] for ts in bf)
    all_ids, all_wts = np.concatenate(ids), np.concatenate(wts)
    ends = np.cumsum([0] + list(tokens))
    want = 0
    for r in range(size):
        gate_up = test_cpu.moe_layer0_reference(xr, all_ids, w1r[r])
        f = ffn[r]
        act = gate_up[:, :f] / (1 + np.exp(-gate_up[:, :f])) * gate_up[:, f:]
        want = want + test_cpu.moe_partial_reference(act, all_ids, all_wts, w2r[r])
    mx, mw1, mw2 = bf[0][rank].to(dev), bf[1][rank].to(dev), bf[2][rank].to(dev)
    mids = torch.as_tensor(ids[rank], device=dev)
    mwts = torch.as_tensor(wts[rank], device=dev)
    got = {}
    for path in ("fused", "unfused"):
        out = torch.full((tokens[rank], 256), float("nan"), dtype=torch.bfloat16, device=dev)
        got[path] = tilelink.moe_mlp(mx, mids, mwts, mw1, mw2, path=path, out=out)
        torch.cuda.synchronize()
        tilelink.world().synchronize()
        err = rel_err(got[path], want[ends[rank]:ends[rank + 1]])
        check(got[path] is out and err < 2e-2, f"moe_mlp {path}: error {err:.2e} against float64")
    check(torch.equal(got["fused"], got["unfused"]), "moe_mlp: fused differs from unfused")
    # the layers alone, chained
    h1 = tilelink.moe_ag_gemm(mx, mids, mwts, mw1[:, :ffn[rank]].contiguous(), tokens=sum(tokens))
    every_ids, every_wts = torch.as_tensor(all_ids, device=dev), torch.as_tensor(all_wts, device=dev)
    c = tilelink.moe_gemm_rs(h1, every_ids, every_wts, mw2, m_split=list(tokens))
    torch.cuda.synchronize()
    tilelink.world().synchronize()
    want0 = test_cpu.moe_layer0_reference(xr, all_ids, w1r[rank][:, :ffn[rank]])
    check(rel_err(h1, want0) < 1e-2, "moe_ag_gemm: error against float64")
    check(tuple(c.shape) == (tokens[rank], 256) and not torch.isnan(c).any(), "moe_gemm_rs: this rank's rows")


def main():
    faulthandler.dump_traceback_later(300, exit=True)  # a hang: every thread's stack, then exit
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local % torch.cuda.device_count())
    w = tilelink.init(timeout=30.0)
    dev = torch.device("cuda", torch.cuda.current_device())
    check(w.rank == rank and w.size == size and tilelink.world() is w, "init: rank, size, world()")

    step("init")
    for op in [s["name"] for s in tilelink.ops()]:
        step(op)
        for call in range(2):  # a made op is reused: fresh inputs on the second call
            a, b = operands(op, size, seed=100 * call + len(op))
            want = reference(op, [x.double().numpy() for x in a], [y.double().numpy() for y in b])[rank]
            mine_a, mine_b = a[rank].to(dev), b[rank].to(dev)
            poisoned = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device=dev)
            fused = getattr(tilelink, op)(mine_a, mine_b, path="fused", out=poisoned)
            unfused = w.run(op, mine_a, mine_b, path="unfused")
            torch.cuda.synchronize()
            w.synchronize()
            check(fused is poisoned and not torch.isnan(fused).any(), f"{op} call {call}: unwritten output")
            err = rel_err(fused, want)
            check(err < 1e-2, f"{op} call {call}: error {err:.2e} against float64")
            check(torch.equal(fused, unfused), f"{op} call {call}: fused differs from unfused")

    step("graph")
    # A CUDA graph captured once, replayed on fresh inputs copied into the captured tensors.
    a, b = operands("gemm_rs", size, seed=7)
    ga, gb = a[rank].to(dev), b[rank].to(dev)
    out = tilelink.gemm_rs(ga, gb, path="fused")  # made and warmed outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilelink.gemm_rs(ga, gb, path="fused", out=out)
    for replay in range(3):
        fa, fb = operands("gemm_rs", size, seed=1000 + replay)
        ga.copy_(fa[rank])
        gb.copy_(fb[rank])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = reference("gemm_rs", [x.double().numpy() for x in fa], [y.double().numpy() for y in fb])[rank]
        err = rel_err(out, want)
        check(not torch.isnan(out).any() and err < 1e-2, f"graph replay {replay}: error {err:.2e}")
    del graph
    torch.cuda.synchronize()

    step("attention")
    attention_and_moe(rank, size, dev)

    # Ranks that disagree are refused on every rank, naming the rank and the field.
    step("refusals")
    if size > 1:
        refuse_disagreeing_ranks(rank, dev)

    # The host time a call adds over the C++ enqueue (median over calls; the GPU work overlaps).
    step("host time")
    a, b = operands("gemm_ar", size, seed=11)
    ca, cb = a[rank].to(dev), b[rank].to(dev)
    out = tilelink.gemm_ar(ca, cb, **SM_FUSED)
    extra = []
    for i in range(200):
        t0 = time.perf_counter()
        tilelink.gemm_ar(ca, cb, out=out, **SM_FUSED)
        extra.append((time.perf_counter() - t0) * 1e6 - w._w.last_enqueue_us)
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    w.synchronize()
    overhead = statistics.median(extra)
    check(overhead < 10.0, f"a Python call adds {overhead:.1f} us over the C++ enqueue (bound 10 us)")

    step("fault")
    stop_seconds = stop_on_a_local_refusal(rank, size, dev) if size > 1 else 0.0
    step("done")

    ok = torch.tensor([len(failures)], dtype=torch.int64)
    dist.all_reduce(ok)
    if rank == 0:
        print(f"torchrun_check: world {size} on {torch.cuda.device_count()} GPU(s): host time over the C++ "
              f"enqueue {overhead:.1f} us (rank 0, median of 200); rank 0's refusal stopped its peers in "
              f"{stop_seconds:.3f} s (slowest, timeout 30 s); {int(ok.item())} failure(s) over all ranks", flush=True)
    # The world's contexts are lost on the stopped ranks: leave without tearing it down.
    sys.stdout.flush()
    os._exit(0 if ok.item() == 0 else 1)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
