"""PyTorch's grouped GEMM (torch._grouped_mm) and a per-expert loop of cuBLAS GEMMs (torch.mm), timed
on the MoE shapes tilelink's grouped GEMM is measured on: the baselines of the grouped-GEMM table.
One GPU, one process:

    python3 bench/torch_grouped_mm.py [--world 8] [--tokens 2048,8192] [--routing uniform,skewed]
                                      [--models mixtral-8x7b,...] [--reps 20]

A tensor-parallel MoE layer on rank 0 of W: M tokens routed top-k to E experts give M * topk grouped
rows (ops/moe_routing.hpp's order: by expert, then token); each expert's FFN of F is split over the
ranks, F_r = F / W. Two grouped GEMMs a layer:
  layer 0: rows x (2 F_r) x H   (X gathered by token times W1 = [gate; up], [E, 2 F_r, H])
  layer 1: rows x H x F_r       (the activations times W2, [E, H, F_r])
bf16 in, bf16 out, fp32 accumulation. torch._grouped_mm takes A [rows, K], the weights [E, N, K]
transposed to [E, K, N] and offs the int32 cumulative row ends. Times: median of `--reps` CUDA-event
timed calls after 3 warm-up calls, the L2 flushed (a 2x-L2 buffer zeroed) before each, as
`tilelink bench grouped_gemm` does.
--counts FILE: the group sizes of every case from `tilelink bench grouped_gemm --counts-out FILE`
(lines "model tokens routing c0 c1 ..."), so both time the same groups; without it the routing is
drawn here (the same patterns, other draws).
Routings (as tilelink's MoeRoutingPattern): uniform (every expert alike) and skewed (expert e drawn
with weight 1 / (1 + e)), top-k distinct experts a token.
"""
import argparse

import torch

from torch_timing import median_ms

MODELS = {  # hidden, ffn, experts, top-k
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "mixtral-8x22b": (6144, 16384, 8, 2),
    "qwen1.5-moe": (2048, 1408, 60, 4),
    "deepseek-moe": (2048, 1408, 64, 6),
    "deepseek-v3": (7168, 2048, 256, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}


def draw_routing(tokens, topk, experts, pattern, gen):
    if pattern == "uniform":
        w = torch.ones(tokens, experts)
    elif pattern == "skewed":
        w = (1.0 / (1.0 + torch.arange(experts, dtype=torch.float64))).float().expand(tokens, experts)
    else:
        raise ValueError(f"unknown routing {pattern}")
    return torch.multinomial(w, topk, replacement=False, generator=gen)  # [tokens, topk], distinct


FLUSH = None


def time_ms(fn, reps):
    return median_ms(torch, fn, reps, warmup=3, before=FLUSH.zero_)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--routing", default="uniform,skewed")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--counts", default="")
    args = ap.parse_args()
    global FLUSH
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    FLUSH = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    given = {}
    if args.counts:
        with open(args.counts) as f:
            for line in f:
                w = line.split()
                if len(w) > 3:
                    given[(w[0], int(w[1]), w[2])] = [int(c) for c in w[3:]]
    gen = torch.Generator().manual_seed(args.seed)
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, world {args.world} (F_r = F / W)")
    print("| model | tokens | routing | layer | rows | N | K | experts empty / max rows | "
          "_grouped_mm ms | TFLOP/s | per-expert torch.mm ms | TFLOP/s | rel. diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        hidden, ffn, experts, topk = MODELS[name]
        f_r = ffn // args.world
        for tokens in (int(t) for t in args.tokens.split(",")):
            for pattern in args.routing.split(","):
                if args.counts:
                    counts = torch.tensor(given[(name, tokens, pattern)], dtype=torch.int64)
                else:
                    ids = draw_routing(tokens, topk, experts, pattern, gen)
                    counts = torch.bincount(ids.flatten(), minlength=experts)
                rows = int(counts.sum())
                offs = torch.cumsum(counts, 0).to(torch.int32).to(dev)
                bounds = [0] + torch.cumsum(counts, 0).tolist()
                for layer, (n, k) in ((0, (2 * f_r, hidden)), (1, (hidden, f_r))):
                    a = (torch.rand(rows, k, device=dev) * 2 - 1).to(torch.bfloat16)
                    w = (torch.rand(experts, n, k, device=dev) * 2 - 1).to(torch.bfloat16)
                    wt = w.transpose(-2, -1)
                    out = torch._grouped_mm(a, wt, offs=offs, out_dtype=torch.bfloat16)
                    loop_out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)

                    def loop():
                        for e in range(experts):
                            if bounds[e + 1] > bounds[e]:
                                torch.mm(a[bounds[e]:bounds[e + 1]], wt[e], out=loop_out[bounds[e]:bounds[e + 1]])

                    loop()
                    diff = ((out.double() - loop_out.double()).norm() / loop_out.double().norm().clamp_min(1e-30)).item()
                    t_g = time_ms(lambda: torch._grouped_mm(a, wt, offs=offs, out_dtype=torch.bfloat16), args.reps)
                    t_l = time_ms(loop, args.reps)
                    flop = 2.0 * rows * n * k
                    print(f"| {name} | {tokens} | {pattern} | {layer} | {rows} | {n} | {k} | "
                          f"{int((counts == 0).sum())} / {int(counts.max())} | {t_g:.3f} | {flop / t_g / 1e9:.0f} | "
                          f"{t_l:.3f} | {flop / t_l / 1e9:.0f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
