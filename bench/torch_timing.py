"""The torch benches' timer (bench/torch_sdpa.py, bench/torch_grouped_mm.py): CUDA events around
each call, the median in ms."""

import statistics


def median_ms(torch, fn, reps, warmup, before=None):
    """Runs fn warmup times, then reps times each timed alone; before() (an L2 flush, say) runs
    before each timed call, outside its events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
