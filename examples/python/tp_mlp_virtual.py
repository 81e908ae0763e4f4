"""A Llama-style tensor-parallel MLP on one process's virtual ranks, from tilelink's ops.

    out = down(silu(gate(x)) * up(x)),  x [M, H], gate/up [F, H], down [H, F]

Sequence-parallel in and out, as Megatron-style TP runs it: rank r holds rows x_r [M_r, H] of the
activations, a column shard of gate and up ([F/W, H] each, stored as one [2F/W, H] weight) and a
row shard of down ([H, F/W]).

    h_r   = ag_gemm(x, w_gu_r)          AllGather of x fused with the GEMM: [M, 2F/W]
    act_r = silu(h_r[:, :F/W]) * h_r[:, F/W:]                              [M, F/W]
    out_r = gemm_rs(act, w_down_r)      GEMM fused with ReduceScatter:     [M_r, H]

Checked against the same layer computed whole in float64.

    python3 examples/python/tp_mlp_virtual.py --world 4 --backend cpu
    python3 examples/python/tp_mlp_virtual.py --world 2 --backend cuda   # torch tensors on GPU 0
"""
import argparse
import time

import tilelink


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tokens", type=int, default=256, help="M, split evenly over the ranks")
    ap.add_argument("--hidden", type=int, default=128, help="H")
    ap.add_argument("--ffn", type=int, default=256, help="F, a multiple of 8 * world")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    W, M, H, F = args.world, args.tokens, args.hidden, args.ffn
    if F % (8 * W):
        raise SystemExit(f"--ffn {F} must be a multiple of 8 * world ({8 * W})")
    f = F // W
    rows = [M // W + (1 if r < M % W else 0) for r in range(W)]
    world = tilelink.virtual(world=W, backend=args.backend)

    if args.backend == "cpu":
        import numpy as np

        rng = np.random.default_rng(0)
        dtype = np.float32

        def rand(*shape, scale=1.0):
            return (rng.uniform(-1, 1, shape) * scale).astype(dtype)

        def silu_mul(h):
            g, u = h[:, :f], h[:, f:]
            return np.ascontiguousarray((g / (1 + np.exp(-g))) * u)

        def f64(x):
            return np.asarray(x, dtype=np.float64)

        concat, sync = np.concatenate, (lambda: None)
    else:
        import torch

        gen = torch.Generator(device="cuda").manual_seed(0)

        def rand(*shape, scale=1.0):
            return ((torch.rand(*shape, generator=gen, device="cuda") * 2 - 1) * scale).to(torch.bfloat16)

        def silu_mul(h):
            g, u = h[:, :f].float(), h[:, f:].float()
            return (torch.nn.functional.silu(g) * u).to(torch.bfloat16).contiguous()

        def f64(x):
            return x.double().cpu().numpy()

        concat, sync = torch.cat, torch.cuda.synchronize

    x = [rand(m, H) for m in rows]
    w_gate = rand(F, H, scale=H ** -0.5)
    w_up = rand(F, H, scale=H ** -0.5)
    w_down = rand(H, F, scale=F ** -0.5)
    # rank r's shards: gate and up rows [r f, (r+1) f) stacked; down columns [r f, (r+1) f)
    w_gu = [concat([w_gate[r * f:(r + 1) * f], w_up[r * f:(r + 1) * f]]) for r in range(W)]
    w_d = [w_down[:, r * f:(r + 1) * f] for r in range(W)]
    w_d = [w.contiguous() if hasattr(w, "contiguous") else w.copy() for w in w_d]

    def layer():
        h = world.ag_gemm(x, w_gu)                    # [M, 2f] on every rank
        act = [silu_mul(hr) for hr in h]              # [M, f]
        return world.gemm_rs(act, w_d, config=tilelink.Config(m_split=rows))  # [M_r, H]

    out = layer()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        out = layer()
    sync()
    ms = (time.perf_counter() - t0) * 1e3 / args.iters

    import numpy as np  # the float64 reference

    X = np.concatenate([f64(t) for t in x])
    G, U, D = f64(w_gate), f64(w_up), f64(w_down)
    hg = X @ G.T
    want = ((hg / (1 + np.exp(-hg))) * (X @ U.T)) @ D.T
    got = np.concatenate([f64(o) for o in out])
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    tol = 1e-5 if args.backend == "cpu" else 2e-2
    ok = got.shape == want.shape and err < tol
    print(f"tp_mlp: world {W} ({args.backend}), M={M} H={H} F={F}: relative error {err:.2e} "
          f"(tolerance {tol:.0e}), {ms:.2f} ms a layer: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
