"""PyTorch's async-TP fused ops (torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter, symmetric memory) timed against PyTorch's own matmul + NCCL collective,
on the shapes of `tilelink bench ag_gemm|gemm_rs --shapes`. One process per GPU:

    python3 -m torch.distributed.run --standalone --nproc_per_node=W bench/torch_async_tp.py \
        --ag 8192x11008x4096,... --rs 8192x4096x11008,... [--nccl-bw]

Shapes MxNxK mean what they mean to tilelink: AG+GEMM: A [M, K] row-sharded (M/W rows a rank),
B [N, K] split over N (N/W a rank), C_r = AllGather(A) B_r^T [M, N/W]. GEMM+RS: A [M, K] and B [N, K]
split over K, C = rows r of sum_i A_i B_i^T [M/W, N]. bf16, uniform [-1, 1) inputs. Times: median per
call over 5 batches of CUDA events, max over ranks. `--nccl-bw` adds the NCCL bandwidth table of
bench/torch_nccl_bw.py at the same sizes (one launch instead of two). NVLink multicast stays off.
"""
import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_nccl_bw import init, nccl_bw_rows, parse_shapes, print_bw_table, shape_args, time_ms  # noqa: E402


def rel_diff(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


def max_over_ranks(x):
    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def uniform(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)


def ag_gemm_row(m, n, k, group_name, w):
    assert m % w == 0 and n % w == 0, f"AG+GEMM {m}x{n}x{k}: M and N must divide by the world size {w}"
    a = uniform(m // w, k)  # A_r, this rank's rows
    b = uniform(n // w, k)  # B_r [N_r, K]
    bt = b.t()
    gathered = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")

    def comm():
        dist.all_gather_into_tensor(gathered, a)

    def gemm():
        return gathered @ bt

    def baseline():
        comm()
        return gemm()

    op = torch.ops.symm_mem.fused_all_gather_matmul
    kwargs = {"return_A": False} if "return_A" in str(op.default._schema) else {}  # no gathered A back

    def fused():
        return op(a, [bt], 0, group_name, **kwargs)[1][0]

    diff = max_over_ranks(rel_diff(fused(), baseline()))
    return ("ag_gemm", m, n, k, time_ms(baseline), time_ms(comm), time_ms(gemm), time_ms(fused), diff)


def gemm_rs_row(m, n, k, group_name, w):
    assert m % w == 0 and k % w == 0, f"GEMM+RS {m}x{n}x{k}: M and K must divide by the world size {w}"
    a = uniform(m, k // w)  # A_r [M, K_r]
    b = uniform(n, k // w)  # B_r [N, K_r]
    bt = b.t()
    partial = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(m // w, n, dtype=torch.bfloat16, device="cuda")

    def gemm():
        torch.matmul(a, bt, out=partial)

    def comm():
        dist.reduce_scatter_tensor(out, partial)

    def baseline():
        gemm()
        comm()
        return out

    def fused():
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, bt, "sum", 0, group_name)

    diff = max_over_ranks(rel_diff(fused(), baseline().clone()))
    return ("gemm_rs", m, n, k, time_ms(baseline), time_ms(comm), time_ms(gemm), time_ms(fused), diff)


def main():
    ap = shape_args(__doc__)
    ap.add_argument("--nccl-bw", action="store_true", help="also the NCCL bandwidth table at these sizes")
    args = ap.parse_args()
    init(args)
    w = dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # a no-op (deprecated) in newer torch
        symm_mem.enable_symm_mem_for_group(group_name)
    ag, rs = parse_shapes(args.ag), parse_shapes(args.rs)

    if args.nccl_bw:
        bw = nccl_bw_rows(ag, rs)
        if dist.get_rank() == 0:
            print_bw_table(bw, w)
            sys.stdout.flush()

    rows = []
    for m, n, k in ag:
        rows.append(ag_gemm_row(m, n, k, group_name, w))
        torch.cuda.empty_cache()
    for m, n, k in rs:
        rows.append(gemm_rs_row(m, n, k, group_name, w))
        torch.cuda.empty_cache()
    if dist.get_rank() == 0:
        print(f"\nPyTorch {torch.__version__} async-TP (torch.ops.symm_mem) vs matmul + NCCL, world {w}, bf16, "
              f"{torch.cuda.get_device_name()}")
        print("\n| op | world | M | N | K | torch matmul+NCCL ms | NCCL alone ms | matmul alone ms | "
              "torch fused (symm_mem) ms | speedup | rel. diff fused vs unfused |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for op, m, n, k, t_base, t_comm, t_gemm, t_fused, diff in rows:
            print(f"| {op} | {w} | {m} | {n} | {k} | {t_base:.3f} | {t_comm:.3f} | {t_gemm:.3f} | {t_fused:.3f} | "
                  f"{t_base / t_fused:.2f}x | {diff:.2e} |")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
