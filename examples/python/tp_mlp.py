"""A Llama-style tensor-parallel MLP under torchrun, one process per GPU, from tilelink's ops.

    out = down(silu(gate(x)) * up(x)),  x [M, H], gate/up [F, H], down [H, F]

Sequence-parallel in and out, as Megatron-style TP runs it: rank r holds rows x_r [M_r, H] of the
activations, a column shard of gate and up ([F/W, H] each, stored as one [2F/W, H] weight) and a
row shard of down ([H, F/W]).

    h_r   = tilelink.ag_gemm(x_r, w_gu_r)     AllGather of x fused with the GEMM   [M, 2F/W]
    act_r = silu(h_r[:, :F/W]) * h_r[:, F/W:]                                      [M, F/W]
    out_r = tilelink.gemm_rs(act_r, w_d_r)    GEMM fused with the ReduceScatter    [M_r, H]

The same layer written with torch.matmul and torch.distributed's collectives (all_gather_into_tensor,
reduce_scatter_tensor) is the reference: the outputs must match within bf16 tolerance, and both are
timed (CUDA events, median over iterations, the slowest rank's).

    torchrun --nproc-per-node 8 examples/python/tp_mlp.py                  # Llama-3-8B's MLP
    torchrun --nproc-per-node 2 examples/python/tp_mlp.py --tokens 4096 --hidden 4096 --ffn 14336

With more processes than GPUs (ranks sharing a GPU, for a test) the reference's collectives run
through gloo on host copies (NCCL refuses two ranks on one GPU) and the times mean nothing.
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as fn

import tilelink


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="M, split evenly over the ranks")
    ap.add_argument("--hidden", type=int, default=4096, help="H")
    ap.add_argument("--ffn", type=int, default=14336, help="F, a multiple of 8 * world")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group("cpu:gloo,cuda:nccl")
    rank, W = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local % torch.cuda.device_count())
    shared = W > torch.cuda.device_count()  # ranks share a GPU: NCCL cannot run the reference
    tilelink.init()
    M, H, F = args.tokens, args.hidden, args.ffn
    if F % (8 * W):
        raise SystemExit(f"--ffn {F} must be a multiple of 8 * world ({8 * W})")
    if M % W:
        raise SystemExit(f"--tokens {M} must be a multiple of the world size ({W}): the reference's collectives need it")
    f, m = F // W, M // W

    # Every rank draws the whole layer from one seed and keeps its shards.
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=gen, device="cuda") * 2 - 1) * scale).to(torch.bfloat16)

    x = rand(M, H)[rank * m:(rank + 1) * m].contiguous()
    w_gate, w_up, w_down = rand(F, H, scale=H ** -0.5), rand(F, H, scale=H ** -0.5), rand(H, F, scale=F ** -0.5)
    w_gu = torch.cat([w_gate[rank * f:(rank + 1) * f], w_up[rank * f:(rank + 1) * f]]).contiguous()
    w_d = w_down[:, rank * f:(rank + 1) * f].contiguous()
    del w_gate, w_up, w_down

    def silu_mul(h):
        return fn.silu(h[:, :f]) * h[:, f:]

    def tilelink_layer():
        h = tilelink.ag_gemm(x, w_gu)                  # [M, 2f]
        return tilelink.gemm_rs(silu_mul(h), w_d)      # [m, H]

    def all_gather(t):
        out = torch.empty((W * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        if shared:
            host = torch.empty_like(out, device="cpu")
            dist.all_gather_into_tensor(host, t.cpu())
            return out.copy_(host)
        dist.all_gather_into_tensor(out, t)
        return out

    def reduce_scatter(t):
        out = torch.empty((t.shape[0] // W,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        if shared:  # gloo has no reduce_scatter_tensor: an all_reduce, then this rank's rows
            host = t.cpu()
            dist.all_reduce(host)
            return out.copy_(host[rank * out.shape[0]:(rank + 1) * out.shape[0]])
        dist.reduce_scatter_tensor(out, t)
        return out

    def torch_layer():
        h = torch.matmul(all_gather(x), w_gu.t())     # [M, 2f]
        return reduce_scatter(torch.matmul(silu_mul(h), w_d.t()))  # [m, H]

    def timed(layer):
        layer()  # warm: made ops, NCCL communicators, cuBLAS handles
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            dist.all_reduce(torch.zeros(1))  # a barrier (gloo: host tensors)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = layer()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        slowest = torch.tensor([statistics.median(times)])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return out, float(slowest.item())

    got, ms_tilelink = timed(tilelink_layer)
    want, ms_torch = timed(torch_layer)
    err = torch.tensor([float((got.float() - want.float()).norm() / want.float().norm())])
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    tol = 2e-2
    ok = bool(err.item() < tol and not torch.isnan(got).any())
    if rank == 0:
        note = " (ranks share a GPU: times mean nothing)" if shared else ""
        print(f"tp_mlp: world {W}, M={M} H={H} F={F} bf16: torch.matmul + torch.distributed {ms_torch:.3f} ms, "
              f"tilelink {ms_tilelink:.3f} ms ({ms_torch / ms_tilelink:.2f}x){note}; relative difference "
              f"{err.item():.2e} (tolerance {tol:.0e}): {'OK' if ok else 'FAILED'}", flush=True)
    tilelink.world().close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
