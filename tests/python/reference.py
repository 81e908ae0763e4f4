"""The float64 outputs of every rank for the registered ops, shared by the CPU and the CUDA tests."""
import numpy as np


def reference(op, a, b, m_split=None):
    """Rank r's float64 output, given every rank's A_r and B_r (numpy arrays of any float dtype)."""
    world = len(a)
    a64 = [np.asarray(x, dtype=np.float64) for x in a]
    b64 = [np.asarray(y, dtype=np.float64) for y in b]
    if op == "ag_gemm":
        full = np.concatenate(a64)
        return [full @ y.T for y in b64]
    total = sum(x @ y.T for x, y in zip(a64, b64))
    if op == "gemm_ar":
        return [total] * world
    m = total.shape[0]
    counts = m_split or [m // world + (1 if r < m % world else 0) for r in range(world)]
    starts = np.cumsum([0] + list(counts))
    return [total[starts[r]:starts[r + 1]] for r in range(world)]
