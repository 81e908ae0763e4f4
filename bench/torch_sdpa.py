"""PyTorch's scaled_dot_product_attention, each fused backend on its own, timed on the shapes
`tilelink bench attention` runs: the baselines of the attention table. One GPU, one process:

    python3 bench/torch_sdpa.py [--shapes default|small|BxSxHqxHkvxD,...] [--causal no|yes|both]
                                [--dtype bf16|fp16] [--reps 10] [--warmup 2] [--ours FILE]

Shapes (B batch, S = seq_q = seq_k, Hq query heads, Hkv key/value heads, D head_dim), each without
and with the causal mask, as tools/tilelink/cmd_bench_attn.cu:
  default  1x8192x32x32x128, 1x8192x32x8x128, 2x8192x32x32x128, 1x32768x32x8x128,
           2x32768x32x32x128, 1x131072x32x8x128, 1x32768x32x32x64
  small    1x1024x32x8x128, 2x2048x32x32x128, 1x2048x16x16x64
Q, K and V are made [b, s, h, d] (uniform in [-1, 1)) and handed to SDPA as the (b, h, s, d) view
.transpose(1, 2), as a model's projections give them; the default scale 1 / sqrt(D).
Backends, each forced by torch.nn.attention.sdpa_kernel: FLASH_ATTENTION, CUDNN_ATTENTION,
EFFICIENT_ATTENTION. A backend that raises for a shape is skipped, its reason listed after the table.
GQA (Hkv < Hq): enable_gqa=True first; where the backend refuses it, K and V are expanded to Hq heads
by repeat_interleave outside the timed region ("kv expanded" in the notes: that backend then reads
Hq / Hkv times the key/value bytes the GQA kernels read).
Times: median of --reps CUDA-event timed calls after --warmup calls, no L2 flush (as tilelink bench
attention). FLOPs = 4 B Hq S^2 D, halved under the mask.
--ours FILE: the rows of `tilelink bench attention --out FILE` (batch seq heads_q heads_kv head_dim
causal time_ms tflops, tab-separated), joined on the shape and mask: our TFLOP/s, the fastest torch
backend and its TFLOP/s, and ours / fastest as a ratio of times (> 1: ours is faster), then the
median ratio without the mask, with it and over all rows, and the minimum.
"""
import argparse
import datetime
import statistics
import warnings

from torch_timing import median_ms

DEFAULT_SHAPES = [  # batch, seq, heads_q, heads_kv, head_dim
    (1, 8192, 32, 32, 128),
    (1, 8192, 32, 8, 128),
    (2, 8192, 32, 32, 128),
    (1, 32768, 32, 8, 128),
    (2, 32768, 32, 32, 128),
    (1, 131072, 32, 8, 128),
    (1, 32768, 32, 32, 64),
]
SMALL_SHAPES = [
    (1, 1024, 32, 8, 128),
    (2, 2048, 32, 32, 128),
    (1, 2048, 16, 16, 64),
]
BACKEND_NAMES = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"]
SHORT = {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "efficient"}


def parse_shapes(text):
    if text == "default":
        return DEFAULT_SHAPES
    if text == "small":
        return SMALL_SHAPES
    shapes = []
    for item in filter(None, text.split(",")):
        parts = item.split("x")
        if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"bad shape '{item}' in --shapes; expected default, small or BxSxHqxHkvxD,...")
        shapes.append(tuple(int(p) for p in parts))
    if not shapes:
        raise SystemExit("--shapes is empty")
    return shapes


def shape_name(shape):
    return "x".join(str(x) for x in shape)


def flops(shape, causal):
    b, s, hq, _, d = shape
    f = 4.0 * b * hq * s * s * d
    return f / 2 if causal else f


def read_ours(path):
    """{(batch, seq, heads_q, heads_kv, head_dim, causal): (time_ms, tflops)} from the --out TSV."""
    rows = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) != 8 or not w[0].isdigit():
                continue  # the header line, blank lines
            key = tuple(int(x) for x in w[:5]) + (w[5] in ("1", "yes", "true"),)
            rows[key] = (float(w[6]), float(w[7]))
    return rows


def first_line(text, limit=200):
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def time_ms(torch, fn, reps, warmup):
    return median_ms(torch, fn, reps, warmup)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="default")
    ap.add_argument("--causal", default="both", choices=["no", "yes", "both"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ours", default="")
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    masks = [c for c in (False, True) if args.causal == "both" or (args.causal == "yes") == c]
    ours = read_ours(args.ours) if args.ours else None

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        cudnn = torch.backends.cudnn.version()
    except RuntimeError as e:  # e.g. another cuDNN first on LD_LIBRARY_PATH
        cudnn = f"unusable ({first_line(e, 120)})"
    print(f"# date {now}; torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}; "
          f"{torch.cuda.get_device_name()}")
    print(f"# {args.dtype}, [b, s, h, d] transposed to (b, h, s, d); reps {args.reps}, warmup "
          f"{args.warmup}; TFLOP/s from 4 B Hq S^2 D (halved under the mask)")

    head = "| B | S | Hq | Hkv | D | causal | " + " | ".join(f"{SHORT[n]} TF/s" for n in BACKEND_NAMES)
    head += " | notes |"
    if ours is not None:
        head += " ours TF/s | fastest torch | its TF/s | ours / fastest |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))

    skipped = []  # (backend, shape, causal, reason)
    ratios = {False: [], True: []}
    ratio_rows = []  # (ratio, shape, causal)

    def attempt(backend, q, k, v, causal, **kw):
        """Runs SDPA once under `backend`; None, or why the backend refused."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
                torch.cuda.synchronize()
                return None
            except (RuntimeError, TypeError, ValueError) as e:
                said = [str(w.message) for w in caught if "kernel not used" in str(w.message)]
                return first_line("; ".join(said + [str(e)]))

    for causal in masks:
        for shape in shapes:
            b, s, hq, hkv, d = shape
            if hq % hkv:
                raise SystemExit(f"shape {shape_name(shape)}: heads_q {hq} is not a multiple of heads_kv {hkv}")
            groups = hq // hkv
            q = torch.empty(b, s, hq, d, device=dev, dtype=dtype).uniform_(-1, 1).transpose(1, 2)
            k = torch.empty(b, s, hkv, d, device=dev, dtype=dtype).uniform_(-1, 1).transpose(1, 2)
            v = torch.empty(b, s, hkv, d, device=dev, dtype=dtype).uniform_(-1, 1).transpose(1, 2)
            times, notes = {}, []  # backend name: ms
            for name in BACKEND_NAMES:
                backend = getattr(SDPBackend, name)
                kk, vv, kw = k, v, {}
                if groups > 1:
                    kw = {"enable_gqa": True}
                    why = attempt(backend, q, kk, vv, causal, **kw)
                    if why is not None:  # this backend refuses GQA: expand K and V, untimed
                        gqa_why, kw = why, {}
                        try:
                            kk = k.repeat_interleave(groups, dim=1)
                            vv = v.repeat_interleave(groups, dim=1)
                            why = attempt(backend, q, kk, vv, causal)
                        except RuntimeError as e:  # out of memory
                            why = first_line(e)
                        if why is None:
                            notes.append(f"{SHORT[name]} kv expanded")
                        else:
                            why = f"enable_gqa: {gqa_why}; kv expanded: {why}"
                else:
                    why = attempt(backend, q, kk, vv, causal)
                if why is not None:
                    skipped.append((SHORT[name], shape, causal, why))
                    notes.append(f"{SHORT[name]} skipped")
                else:
                    with sdpa_kernel(backend):
                        times[name] = time_ms(
                            torch, lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw),
                            args.reps, args.warmup)
                del kk, vv
                torch.cuda.empty_cache()

            def tf(ms):
                return flops(shape, causal) / (ms * 1e-3) / 1e12

            cells = [f"{tf(times[n]):.1f}" if n in times else "-" for n in BACKEND_NAMES]
            row = f"| {b} | {s} | {hq} | {hkv} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells)
            row += f" | {', '.join(notes)} |"
            if ours is not None:
                mine = ours.get((b, s, hq, hkv, d, causal))  # (time_ms, tflops)
                fastest = min(times, key=times.get) if times else None
                mine_cell = f"{mine[1]:.1f}" if mine else "-"
                fastest_cells = f"{SHORT[fastest]} | {tf(times[fastest]):.1f}" if fastest else "- | -"
                ratio_cell = "-"
                if mine and fastest:
                    # A ratio of times (> 1: ours is faster); ours' TFLOP/s count the mask's
                    # diagonal exactly, torch's columns S^2 / 2.
                    ratio = times[fastest] / mine[0]
                    ratios[causal].append(ratio)
                    ratio_rows.append((ratio, shape, causal))
                    ratio_cell = f"{ratio:.3f}"
                row += f" {mine_cell} | {fastest_cells} | {ratio_cell} |"
            print(row, flush=True)
            del q, k, v
            torch.cuda.empty_cache()

    if skipped:
        print("\nSkipped:")
        for name, shape, causal, why in skipped:
            print(f"- {name}, {shape_name(shape)}{' causal' if causal else ''}: {why}")
    if ours is not None:
        print()
        every = ratios[False] + ratios[True]
        for label, values in (("no mask", ratios[False]), ("causal", ratios[True]), ("all", every)):
            if values:
                print(f"ours / fastest torch backend, {label}: median {statistics.median(values):.3f} "
                      f"over {len(values)} shapes")
        if ratio_rows:
            low = min(ratio_rows, key=lambda r: r[0])
            print(f"ours / fastest torch backend, minimum: {low[0]:.3f} "
                  f"({shape_name(low[1])}{' causal' if low[2] else ''})")
        else:
            print("ours / fastest torch backend: no shape of --ours matched a timed row")


if __name__ == "__main__":
    main()
