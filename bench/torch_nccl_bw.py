"""NCCL all-gather and reduce-scatter bandwidth through torch.distributed, at the message sizes of the
fused ops' shapes (bf16). One process per GPU:

    python3 -m torch.distributed.run --standalone --nproc_per_node=W bench/torch_nccl_bw.py \
        --ag 8192x11008x4096,... --rs 8192x4096x11008,...

Shapes are MxNxK with tilelink's meaning (tilelink bench ag_gemm|gemm_rs --shapes): AG+GEMM gathers
A [M, K] from row shards of M/W rows; GEMM+RS reduce-scatters the partial C [M, N] into M/W rows.
Bandwidths as nccl-tests defines them: algbw = total bytes / time (the gathered output, the
reduce-scatter's input), busbw = algbw * (W - 1) / W. Time: median per call over 5 batches.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0), also when the caller forgot.
"""
import argparse
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_shapes(text):
    out = []
    for item in filter(None, text.split(",")):
        m, n, k = (int(x) for x in item.split("x"))
        out.append((m, n, k))
    return out


TIMING = {"warmup": 3, "iters": 10}  # --warmup / --iters


def time_ms(fn, warmup=None, iters=None, batches=5):
    """Median over batches of the mean time per call (CUDA events), max over ranks."""
    warmup = TIMING["warmup"] if warmup is None else warmup
    iters = TIMING["iters"] if iters is None else iters
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    per_call.sort()
    t = torch.tensor([per_call[len(per_call) // 2]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def nccl_bw_rows(ag_shapes, rs_shapes):
    """Rows (collective, shape, per-rank MB, total MB, ms, algbw GB/s, busbw GB/s), every rank."""
    w = dist.get_world_size()
    rows = []
    for m, n, k in ag_shapes:
        shard = torch.empty(m // w, k, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        out = torch.empty(m // w * w, k, dtype=torch.bfloat16, device="cuda")
        ms = time_ms(lambda: dist.all_gather_into_tensor(out, shard))
        total = out.numel() * 2
        rows.append(("all_gather", f"{m}x{n}x{k}", shard.numel() * 2, total, ms))
        del shard, out
    for m, n, k in rs_shapes:
        full = torch.empty(m // w * w, n, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        out = torch.empty(m // w, n, dtype=torch.bfloat16, device="cuda")
        ms = time_ms(lambda: dist.reduce_scatter_tensor(out, full))
        total = full.numel() * 2
        rows.append(("reduce_scatter", f"{m}x{n}x{k}", out.numel() * 2, total, ms))
        del full, out
    return rows


def print_bw_table(rows, w):
    print(f"\nNCCL {'.'.join(map(str, torch.cuda.nccl.version()))} through torch {torch.__version__}, "
          f"world {w}, bf16, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")
    print("\n| collective | shape MxNxK | per-rank MB | total MB | ms | algbw GB/s | busbw GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for coll, shape, per_rank, total, ms in rows:
        algbw = total / (ms * 1e-3) / 1e9
        print(f"| {coll} | {shape} | {per_rank / 1e6:.1f} | {total / 1e6:.1f} | {ms:.3f} | {algbw:.0f} | "
              f"{algbw * (w - 1) / w:.0f} |")


def shape_args(doc):
    """The options both benches take: --ag / --rs shapes, --warmup, --iters."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ag", default="", help="AG+GEMM shapes MxNxK,...")
    ap.add_argument("--rs", default="", help="GEMM+RS shapes MxNxK,...")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10, help="calls per timed batch (5 batches)")
    return ap


def init(args):
    """Timing from the options; this torchrun rank's GPU and the NCCL process group."""
    TIMING.update(warmup=args.warmup, iters=args.iters)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))


def main():
    args = shape_args(__doc__).parse_args()
    init(args)
    rows = nccl_bw_rows(parse_shapes(args.ag), parse_shapes(args.rs))
    if dist.get_rank() == 0:
        print_bw_table(rows, dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
