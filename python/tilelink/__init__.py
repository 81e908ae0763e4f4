"""tilelink: compute-communication overlapping ops, built from tile-centric primitives.

Two kinds of world. Under torchrun, one process per GPU: :func:`init` joins the processes of a
torch.distributed group, and an op takes this rank's tensors and returns this rank's output::

    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    tilelink.init()                                   # every rank of the group calls it
    c = tilelink.ag_gemm(a, b)                        # a: this rank's A_r [M_r, K], b: B_r [N_r, K]

In one process, :func:`virtual` holds every rank's operands: the CPU backend runs its ranks as
threads, the CUDA backend as virtual ranks on one GPU (its SMs split into green contexts). An op
takes a list of arrays per operand, one per rank, from any DLPack producer (numpy, torch), and
returns one output per rank, allocated like the inputs (or written into ``out``)::

    import numpy as np, tilelink
    world = tilelink.virtual(world=2, backend="cpu")
    a = [np.random.rand(64, 32).astype(np.float32) for _ in range(2)]   # A_r [M_r, K]
    b = [np.random.rand(48, 32).astype(np.float32) for _ in range(2)]   # B_r [N_r, K]
    c = world.ag_gemm(a, b)                                             # C_r = AllGather(A) B_r^T

Every registered op is a method (``tilelink.ops()`` lists them): ``ag_gemm`` (AllGather + GEMM,
N split), ``gemm_rs`` (GEMM + ReduceScatter, K split) and ``gemm_ar`` (GEMM + AllReduce, K split).
A world also runs sequence-parallel attention (``sp_attn``, ``ring_attn``) and the tensor-parallel
MoE layers (``moe_mlp``, and its two layers ``moe_ag_gemm`` and ``moe_gemm_rs``); under torchrun
they are module-level functions as well (``tilelink.moe_mlp(x, ids, weights, w1, w2)``).
Wrong dtypes or devices raise TypeError, shapes, strides, counts and options that do not fit raise
ValueError, naming the argument, before anything runs; a wait that runs out of time raises
tilelink.TimeoutError naming the op, rank, signal and tile.
"""
from __future__ import annotations

import atexit
import builtins
import dataclasses
import datetime
import os
import weakref
from typing import Any, Callable, Optional, Sequence

from . import _tilelink
from ._tilelink import Error, TimeoutError  # noqa: F401  (re-exported)

__all__ = ["Config", "Error", "ProcessWorld", "TimeoutError", "World", "ag_gemm", "gemm_ar", "gemm_rs", "has_cuda",
           "init", "moe_ag_gemm", "moe_gemm_rs", "moe_mlp", "ops", "ring_attn", "sp_attn", "virtual", "world"]

#: Whether this build holds the CUDA backend.
has_cuda: bool = _tilelink.has_cuda


@dataclasses.dataclass(frozen=True)
class Config:
    """The knobs of a call besides its operands; the defaults are the op's own choices. Immutable
    (``dataclasses.replace(config, comm_sms=8)`` makes a changed copy): made once, it costs a call
    nothing.

    variant: ``"auto"`` or one of the op's variants (``ops()``): ``"pull"``/``"push"`` for
        ag_gemm and gemm_rs, ``"one-shot"``/``"two-shot"`` for gemm_ar.
    m_split: rows of the output per rank for the K-split ops (gemm_rs, gemm_ar's two-shot);
        ``None`` splits M evenly.
    comm_tile: rows of a communication tile; 0 lets the op choose.
    comm_sms: CUDA: SMs of each rank running the communication program; 0 uses the copy engine.
    tile_m, tile_n, comm_workers, compute_workers: CPU: the GEMM tile and the threads of each rank.
    """

    variant: str = "auto"
    m_split: Optional[Sequence[int]] = None
    comm_tile: int = 0
    comm_sms: int = 0
    tile_m: int = 128
    tile_n: int = 128
    comm_workers: int = 1
    compute_workers: int = 1
    _made: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("comm_tile", "comm_sms", "tile_m", "tile_n", "comm_workers", "compute_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{name} must be an int, got {type(value).__name__}")
        if not isinstance(self.variant, str):
            raise TypeError(f"Config.variant must be a str, got {type(self.variant).__name__}")
        if self.m_split is not None:
            object.__setattr__(self, "m_split", tuple(int(x) for x in self.m_split))

    def _knobs(self, path: str) -> "_tilelink.Knobs":
        """The module's knobs for a call on `path`, made once per path."""
        k = self._made.get(path)
        if k is None:
            k = _tilelink.Knobs()
            k.path = path
            k.variant = self.variant
            k.m_split = [] if self.m_split is None else list(self.m_split)
            for name in ("comm_tile", "comm_sms", "tile_m", "tile_n", "comm_workers", "compute_workers"):
                setattr(k, name, getattr(self, name))
            self._made[path] = k
        return k


def ops() -> list:
    """Every registered op: its name, summary, the dimension split over ranks and its variants."""
    return _tilelink.ops()


def _library(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def _empty(like: Any, shape: tuple, float32: bool = False, what: str = "out") -> Any:
    """An uninitialised array of `shape`, of like's library, device and dtype (or float32)."""
    lib = _library(like)
    if lib == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32 if float32 else like.dtype, device=like.device)
    if lib == "numpy":
        import numpy

        return numpy.empty(shape, dtype=numpy.float32 if float32 else like.dtype)
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is not None:
        xp = namespace()
        return xp.empty(shape, dtype=xp.float32 if float32 else like.dtype, device=like.device)
    raise TypeError(f"cannot allocate {what} like the inputs ({type(like).__name__}); pass {what}=")


_TORCH: dict = {}  # set on first use: the Tensor class, dtype codes (module.cpp, dtype_of_code), the raw stream


def _allocated(make: Callable[[], list], *lists: Any) -> list:
    """The outputs make() allocates from the operands' shapes, or [] where the operands are not
    lists of arrays of the expected dimensions (the module's checks then name what is wrong)."""
    if not all(isinstance(x, (list, tuple)) and x for x in lists):
        return []
    try:
        return make()
    except (AttributeError, IndexError):
        return []


def _torch_state() -> dict:
    if not _TORCH:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch.cuda.current_stream reads
        _TORCH.update(tensor=torch.Tensor, codes={torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}, empty=torch.empty,
                      stream=raw if raw is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream))
    return _TORCH


def _torch_operands(xs: Sequence[Any], tensor: type, codes: dict) -> Optional[list]:
    """Torch tensors as the module's raw operand tuples (cheaper than a DLPack export each); None
    when any element is not a torch tensor (the module then reads them by DLPack and names the one
    it cannot)."""
    out = []
    for x in xs:
        if not isinstance(x, tensor):
            return None
        dtype = x.dtype
        out.append((x.data_ptr(), x.dim(), x.shape, x.stride(), codes.get(dtype, dtype), x.get_device()))
    return out


class World:
    """W ranks in this process; make one with :func:`virtual`."""

    def __init__(self, world: int, backend: str, timeout: float = 20.0, device: int = 0):
        self._bind(_tilelink.World(int(world), backend, float(timeout), int(device)))

    def _bind(self, w: "_tilelink.World") -> None:
        self._w = w
        self._cuda = self._w.backend == "cuda"
        self._device = self._w.device
        self._last = 0  # the last call's path: 1 fused, 2 unfused (0: none yet)

    @property
    def last_path(self) -> Optional[tuple]:
        """("fused" or "unfused", why) of the last call, or None before the first."""
        return (("fused", "unfused")[self._last - 1], self._w.last_why) if self._last else None

    @property
    def size(self) -> int:
        return self._w.size

    @property
    def backend(self) -> str:
        return self._w.backend

    def __repr__(self) -> str:
        where = f", device={self._w.device}" if self.backend == "cuda" else ""
        return f"tilelink.World(world={self.size}, backend={self.backend!r}{where})"

    def run(self, op: str, a: Sequence[Any], b: Sequence[Any], *, path: str = "auto",
            config: Optional[Config] = None, out: Optional[Sequence[Any]] = None) -> list:
        """Runs `op` on every rank: a[r], b[r] are rank r's operands; returns the outputs.

        path: ``"fused"``, ``"unfused"`` (the baseline: the whole communication, then the whole
        GEMM, or the reverse) or ``"auto"`` (the op's path model; the CPU backend runs fused).
        """
        if config is None:
            knobs = _DEFAULT_KNOBS.get(path)
            if knobs is None:
                if not isinstance(path, str):
                    raise TypeError(f"path must be a str, got {type(path).__name__}")
                knobs = Config()._knobs(path)
        elif isinstance(config, Config):
            if not isinstance(path, str):
                raise TypeError(f"path must be a str, got {type(path).__name__}")
            knobs = config._knobs(path)
        else:
            raise TypeError(f"config must be a tilelink.Config, got {type(config).__name__}")
        w = self._w
        if out is None:
            shapes = w.output_shapes(op, a, b, knobs)  # checks every operand first
            out = [_empty(a[0], s) for s in shapes]
        # torch tensors: their fields read here (cheaper than a DLPack export of each), and the
        # call ordered on torch's current stream. Anything else (or no lists at all) goes to the
        # module as given, which names what is wrong.
        seqs = (list, tuple)
        first = a[0] if isinstance(a, seqs) and a else None
        if isinstance(b, seqs) and isinstance(out, seqs) and type(first).__module__.startswith("torch"):
            t = _torch_state()
            tensor, codes = t["tensor"], t["codes"]
            ra = _torch_operands(a, tensor, codes)
            rb = _torch_operands(b, tensor, codes) if ra is not None else None
            rc = _torch_operands(out, tensor, codes) if rb is not None else None
            stream = int(t["stream"](self._device)) if self._cuda and first.is_cuda else 0
            if rc is not None:
                self._last = w.run(op, ra, rb, rc, knobs, stream, True)
                return out
        else:
            stream = 0
        self._last = w.run(op, a, b, out, knobs, stream)
        return out

    def close(self) -> None:
        """Frees the world's ops, workspaces and ranks now (a process world: every rank calls it);
        later calls raise tilelink.Error."""
        self._w.close()

    def synchronize(self) -> None:
        """Waits for every rank's work (CUDA); a wait that ran out of time raises TimeoutError
        naming the op, rank, signal and tile. The CPU backend's calls return when done."""
        self._w.synchronize()

    def config(self, op: str, a: Sequence[Any], b: Sequence[Any], *, config: Optional[Config] = None) -> str:
        """How `op` is made for these operands (tiles, SMs, communication method)."""
        cfg = config if config is not None else Config()
        return self._w.config(op, list(a), list(b), cfg._knobs("auto"))

    # The registered ops (every op of ops() is a method; these are spelled out for type checkers).
    def ag_gemm(self, a: Sequence[Any], b: Sequence[Any], *, path: str = "auto",
                config: Optional[Config] = None, out: Optional[Sequence[Any]] = None) -> list:
        """AllGather + GEMM: a[r] = A_r [M_r, K], b[r] = B_r [N_r, K]; returns C_r = AllGather(A) B_r^T [M, N_r]."""
        return self.run("ag_gemm", a, b, path=path, config=config, out=out)

    def gemm_rs(self, a: Sequence[Any], b: Sequence[Any], *, path: str = "auto",
                config: Optional[Config] = None, out: Optional[Sequence[Any]] = None) -> list:
        """GEMM + ReduceScatter: a[r] = A_r [M, K_r], b[r] = B_r [N, K_r]; returns rank r's rows of sum_i A_i B_i^T."""
        return self.run("gemm_rs", a, b, path=path, config=config, out=out)

    def gemm_ar(self, a: Sequence[Any], b: Sequence[Any], *, path: str = "auto",
                config: Optional[Config] = None, out: Optional[Sequence[Any]] = None) -> list:
        """GEMM + AllReduce: a[r] = A_r [M, K_r], b[r] = B_r [N, K_r]; every rank gets sum_i A_i B_i^T [M, N]."""
        return self.run("gemm_ar", a, b, path=path, config=config, out=out)

    # ---- sequence-parallel attention --------------------------------------------------------
    def sp_attn(self, q: Sequence[Any], k: Sequence[Any], v: Sequence[Any], *, causal: bool = False,
                shard: str = "contiguous", path: str = "auto", out: Optional[Sequence[Any]] = None,
                lse: Optional[Sequence[Any]] = None) -> tuple:
        """Sequence-parallel attention, AllGather variant: rank r holds the positions of its shard.

        q[r] [B, S_r, Hq, D], k[r] and v[r] [B, S_r, Hkv, D] (Hq a multiple of Hkv), the rows in
        shard order: ``shard="contiguous"`` (rank r holds a segment, S_r any sizes) or ``"zigzag"``
        (S cut into 2W even chunks, rank r holds chunks r and 2W - 1 - r). Returns (out, lse):
        out[r] = softmax(q[r] K^T / sqrt(D) + mask) V over the whole sequence [B, S_r, Hq, D], lse[r]
        the rows' log-sum-exp, float32 [B, S_r, Hq]. The CUDA backend takes bfloat16 or float16,
        head dim 64 or 128; path as World.run.
        """
        return self._attention("sp_attn", q, k, v, causal, shard, path, out, lse)

    def ring_attn(self, q: Sequence[Any], k: Sequence[Any], v: Sequence[Any], *, causal: bool = False,
                  shard: str = "contiguous", path: str = "auto", out: Optional[Sequence[Any]] = None,
                  lse: Optional[Sequence[Any]] = None) -> tuple:
        """Ring attention: as sp_attn, each rank's K and V block travelling once around the ring
        while every step is folded into the output (log-sum-exp merge)."""
        return self._attention("ring_attn", q, k, v, causal, shard, path, out, lse)

    def _attention(self, op: str, q: Sequence[Any], k: Sequence[Any], v: Sequence[Any], causal: bool, shard: str,
                   path: str, out: Optional[Sequence[Any]], lse: Optional[Sequence[Any]]) -> tuple:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, (list, tuple)):
                raise TypeError(f"{name} must be a list of arrays, one per rank, got {type(x).__name__}")
        if not isinstance(shard, str) or not isinstance(path, str):
            raise TypeError("shard and path must be str")
        if out is None:
            out = [_empty(x, tuple(x.shape), what="out") for x in q]
        if lse is None:
            lse = [_empty(x, tuple(x.shape[:3]), float32=True, what="lse") for x in q]
        first = q[0] if q else None
        stream = 0
        if self._cuda and type(first).__module__.startswith("torch") and first.is_cuda:
            stream = int(_torch_state()["stream"](self._device))
        self._last = self._w.attention(op, list(q), list(k), list(v), list(out), list(lse), bool(causal), shard, path,
                                       stream)
        return out, lse

    # ---- MoE layers (tensor-parallel experts) ------------------------------------------------
    def moe_mlp(self, x: Sequence[Any], topk_ids: Sequence[Any], topk_weights: Sequence[Any], w1: Sequence[Any],
                w2: Sequence[Any], *, path: str = "auto", out: Optional[Sequence[Any]] = None) -> list:
        """The whole tensor-parallel MoE layer: rank r holds its tokens x[r] [M_r, H] and their
        routing (topk_ids[r] int32 and topk_weights[r] float32, [M_r, topk], from the router), and
        a shard of every expert: w1[r] [E, 2 F_r, H] (the gate rows, then the up rows) and w2[r]
        [E, H, F_r]. Returns out[r] [M_r, H]: for each of its tokens, sum over the token's slots of
        weight * (SiLU(x W_gate^T) * (x W_up^T)) W2^T, summed over the ranks' shards. Every token's
        routing is gathered, so each rank computes its shard of every routed (token, expert) pair.
        path as World.run. An expert id outside [0, E) raises tilelink.Error naming the token and
        slot: during the call on the CPU backend, at the next World.synchronize() on CUDA (the ids
        live on the device, and a call does not wait for it).
        """
        if out is None:
            out = _allocated(lambda: [_empty(t, (t.shape[0], w.shape[1])) for t, w in zip(x, w2)], x, topk_ids, w2)
        return self._moe("moe_mlp", x, topk_ids, topk_weights, w1, w2, path, out)

    def moe_ag_gemm(self, x: Sequence[Any], topk_ids: Sequence[Any], topk_weights: Sequence[Any],
                    w1: Sequence[Any], *, path: str = "auto", out: Optional[Sequence[Any]] = None) -> list:
        """MoE layer 0: the AllGather of every rank's tokens and routing, then the grouped GEMM.
        x[r] [M_r, H], topk_ids[r] / topk_weights[r] [M_r, topk], w1[r] [E, F_r, H]. Returns
        out[r] [M * topk, F_r]: row i is x[t] W1[e]^T for the i-th (token t, expert e) pair in
        grouped order, the pairs p = t * topk + slot of all M tokens (in rank order) sorted stably
        by expert: ``numpy.argsort(concatenated_ids.ravel(), kind="stable")`` lists them.
        """
        if out is None:
            def made() -> list:
                rows = builtins.sum(int(t.shape[0]) for t in x) * int(topk_ids[0].shape[1])
                return [_empty(t, (rows, w.shape[1])) for t, w in zip(x, w1)]
            out = _allocated(made, x, topk_ids, w1)
        return self._moe("moe_ag_gemm", x, topk_ids, topk_weights, w1, None, path, out)

    def moe_gemm_rs(self, h1: Sequence[Any], topk_ids: Sequence[Any], topk_weights: Sequence[Any],
                    w2: Sequence[Any], *, m_split: Optional[Sequence[int]] = None, path: str = "auto",
                    out: Optional[Sequence[Any]] = None) -> list:
        """MoE layer 1: the grouped GEMM, the top-k reduce and the ReduceScatter. h1[r]
        [M * topk, F_r] in the grouped order of moe_ag_gemm, topk_ids[r] / topk_weights[r]
        [M, topk] every token's routing (the same on every rank), w2[r] [E, H, F_r]. Returns
        out[r] [M_r, H]: rank r's tokens' rows of sum_s topk_reduce(h1[s] W2_s^T). m_split: M_r by
        rank (or the rows of out); None splits M evenly, the first ranks taking one more.
        """
        if out is None:
            world = self.size
            split = None if m_split is None else [int(m) for m in m_split]
            if split is not None and len(split) != world:
                raise ValueError(f"m_split holds {len(split)} counts, the world has {world} ranks")

            def made() -> list:
                tokens = int(topk_ids[0].shape[0])
                counts = split or [tokens // world + (1 if r < tokens % world else 0) for r in range(world)]
                mine = [counts[r] for r in self._ranks()]
                return [_empty(h, (m, w.shape[1])) for h, m, w in zip(h1, mine, w2)]
            out = _allocated(made, h1, topk_ids, w2)
        elif m_split is not None:
            raise ValueError("pass m_split or out, not both (out's rows give the split)")
        return self._moe("moe_gemm_rs", h1, topk_ids, topk_weights, None, w2, path, out)

    def _ranks(self) -> list:
        """The ranks whose operands a call here takes, in order."""
        return list(range(self.size))

    def _moe(self, op: str, a: Sequence[Any], ids: Sequence[Any], weights: Sequence[Any], w1: Optional[Sequence[Any]],
             w2: Optional[Sequence[Any]], path: str, out: Sequence[Any]) -> list:
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, got {type(path).__name__}")
        first = a[0] if isinstance(a, (list, tuple)) and a else None
        stream = 0
        if self._cuda and type(first).__module__.startswith("torch") and first.is_cuda:
            stream = int(_torch_state()["stream"](self._device))
        self._last = self._w.moe(op, a, ids, weights, w1, w2, out, path, stream)
        return out


_DEFAULT_KNOBS = {p: Config()._knobs(p) for p in ("auto", "fused", "unfused")}


def _add_op_method(name: str, summary: str) -> None:
    def method(self: World, a: Sequence[Any], b: Sequence[Any], *, path: str = "auto",
               config: Optional[Config] = None, out: Optional[Sequence[Any]] = None) -> list:
        return self.run(name, a, b, path=path, config=config, out=out)

    method.__name__ = name
    method.__doc__ = f"{summary}. See World.run."
    setattr(World, name, method)


for _spec in _tilelink.ops():
    if not hasattr(World, _spec["name"]):
        _add_op_method(_spec["name"], _spec["summary"])


def virtual(world: int = 1, backend: str = "auto", timeout: float = 20.0, device: int = 0) -> World:
    """A world of `world` ranks in this process.

    backend: ``"cuda"`` (virtual ranks on GPU `device`, its SMs split between them), ``"cpu"``
    (ranks as threads) or ``"auto"`` (cuda where this build has it and a GPU is visible).
    timeout: the bound, in seconds, of every wait; a wait that runs out raises TimeoutError.
    """
    if backend == "auto":
        backend = "cuda" if has_cuda and _tilelink.cuda_device_count() > 0 else "cpu"
    return World(world, backend, timeout, device)


class ProcessWorld(World):
    """This process's rank of a world of processes (one per GPU); make one with :func:`init`.

    An op takes this rank's operands (one array each, torch CUDA tensors on this rank's GPU) and
    returns this rank's output. Every rank makes the same calls in the same order, each with its
    own operands; the first call of a problem exchanges the ranks' shapes through the group (and
    refuses, on every rank, ranks that call another op or with other options), later calls of the
    same shapes do not. A rank whose shapes change between calls while another's do not must pass
    the split in ``Config.m_split`` (K-split ops).
    """

    def __init__(self, w: "_tilelink.World"):  # noqa: D107  (made by init)
        self._bind(w)

    @property
    def rank(self) -> int:
        return self._w.rank

    def __repr__(self) -> str:
        return f"tilelink.ProcessWorld(rank={self.rank}, size={self.size}, device={self._w.device})"

    def run(self, op: str, a: Any, b: Any, *, path: str = "auto", config: Optional[Config] = None,
            out: Optional[Any] = None) -> Any:
        """Runs `op` with this rank's operands a, b; returns this rank's output (see World.run)."""
        # The common call (torch tensors, default or a made Config) straight to the module: the
        # process-per-GPU case, where the host time of a call counts.
        t = _TORCH or _torch_state()
        tensor = t["tensor"]
        if isinstance(a, tensor) and isinstance(b, tensor) and (out is None or isinstance(out, tensor)):
            if config is None:
                knobs = _DEFAULT_KNOBS.get(path)
            elif type(config) is Config and type(path) is str:
                knobs = config._knobs(path)
            else:
                knobs = None
            if knobs is not None:
                codes, w = t["codes"], self._w
                ra = [(a.data_ptr(), a.dim(), a.shape, a.stride(), codes.get(a.dtype, a.dtype), a.get_device())]
                rb = [(b.data_ptr(), b.dim(), b.shape, b.stride(), codes.get(b.dtype, b.dtype), b.get_device())]
                if out is None:
                    out = t["empty"](w.output_shapes(op, ra, rb, knobs, True)[0], dtype=a.dtype, device=a.device)
                rc = [(out.data_ptr(), out.dim(), out.shape, out.stride(), codes.get(out.dtype, out.dtype),
                       out.get_device())]
                stream = int(t["stream"](self._device)) if a.is_cuda else 0
                self._last = w.run(op, ra, rb, rc, knobs, stream, True)
                return out
        return World.run(self, op, [a], [b], path=path, config=config, out=None if out is None else [out])[0]

    def config(self, op: str, a: Any, b: Any, *, config: Optional[Config] = None) -> str:
        return World.config(self, op, [a], [b], config=config)

    def _ranks(self) -> list:
        return [self.rank]

    # The ops outside the registry, on this rank's operands (see World's): the first call of a
    # shape exchanges every rank's extents (S_r; M_r and F_r) and checks that the ranks agree.
    def sp_attn(self, q: Any, k: Any, v: Any, *, causal: bool = False, shard: str = "contiguous",
                path: str = "auto", out: Optional[Any] = None, lse: Optional[Any] = None) -> tuple:
        """This rank's shard of sequence-parallel attention (World.sp_attn): returns (out, lse)."""
        o, l = World.sp_attn(self, [q], [k], [v], causal=causal, shard=shard, path=path, out=_one(out), lse=_one(lse))
        return o[0], l[0]

    def ring_attn(self, q: Any, k: Any, v: Any, *, causal: bool = False, shard: str = "contiguous",
                  path: str = "auto", out: Optional[Any] = None, lse: Optional[Any] = None) -> tuple:
        """This rank's shard of ring attention (World.ring_attn): returns (out, lse)."""
        o, l = World.ring_attn(self, [q], [k], [v], causal=causal, shard=shard, path=path, out=_one(out),
                               lse=_one(lse))
        return o[0], l[0]

    def moe_mlp(self, x: Any, topk_ids: Any, topk_weights: Any, w1: Any, w2: Any, *, path: str = "auto",
                out: Optional[Any] = None) -> Any:
        """The MoE layer on this rank's tokens and expert shards (World.moe_mlp): returns [M_r, H]."""
        return World.moe_mlp(self, [x], [topk_ids], [topk_weights], [w1], [w2], path=path, out=_one(out))[0]

    def moe_ag_gemm(self, x: Any, topk_ids: Any, topk_weights: Any, w1: Any, *, tokens: Optional[int] = None,
                    path: str = "auto", out: Optional[Any] = None) -> Any:
        """MoE layer 0 on this rank's operands (World.moe_ag_gemm): returns [M * topk, F_r]. Its rows
        count every rank's tokens, which this rank does not see: pass tokens=M (or out=)."""
        if out is None:
            if tokens is None:
                raise ValueError("moe_ag_gemm in a process world: pass tokens= (M, every rank's tokens) or out=")
            out = _empty(x, (int(tokens) * int(topk_ids.shape[1]), w1.shape[1]))
        return World.moe_ag_gemm(self, [x], [topk_ids], [topk_weights], [w1], path=path, out=[out])[0]

    def moe_gemm_rs(self, h1: Any, topk_ids: Any, topk_weights: Any, w2: Any, *,
                    m_split: Optional[Sequence[int]] = None, path: str = "auto", out: Optional[Any] = None) -> Any:
        """MoE layer 1 on this rank's operands (World.moe_gemm_rs), topk_ids / topk_weights every
        token's: returns this rank's [M_r, H]."""
        return World.moe_gemm_rs(self, [h1], [topk_ids], [topk_weights], [w2], m_split=m_split, path=path,
                                 out=_one(out))[0]


def _one(x: Optional[Any]) -> Optional[list]:
    return None if x is None else [x]


_INIT: Optional[ProcessWorld] = None  # the world of init(), which the module-level ops use
_OPEN: "weakref.WeakSet[ProcessWorld]" = weakref.WeakSet()


@atexit.register
def _close_process_worlds() -> None:
    # Before the interpreter (and torch.distributed) goes: a world's teardown exchanges with its
    # peers. A peer already gone only makes the exchange time out.
    for w in list(_OPEN):
        try:
            w.close()
        except Exception:  # noqa: BLE001  (leaving anyway)
            pass


def _gloo_exchange(group: Any, timeout: float) -> Callable[[bytes, float, str], bytes]:
    """The module's bootstrap over a gloo group with `group`'s ranks: every rank's bytes, in rank order."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group)
    gloo = dist.new_group(ranks=ranks, backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    size = len(ranks)

    def exchange(mine: bytes, timeout_s: float, what: str) -> bytes:
        t = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        parts = [torch.empty_like(t) for _ in range(size)]
        try:
            work = dist.all_gather(parts, t, group=gloo, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:
            text = str(e)
            if "imed out" in text or "timeout" in text.lower():
                raise builtins.TimeoutError(text) from e
            raise
        return b"".join(p.numpy().tobytes() for p in parts)

    return exchange




def init(group: Any = None, *, device: Optional[int] = None, timeout: float = 20.0,
         stop_on_error: bool = True) -> ProcessWorld:
    """Joins the processes of a torch.distributed group into one tilelink world (the ipc transport:
    one process per rank, CUDA IPC between them); the module-level ops (``tilelink.ag_gemm``...)
    then run on it. Collective: every process of the default group calls it (it makes a gloo group
    for its exchanges: IPC handles, each op's agreement, barriers).

    group: the torch.distributed group (None: the default group); its rank order is the world's.
    device: this rank's GPU; None takes ``LOCAL_RANK`` (torchrun sets it) modulo the visible GPUs,
        else torch's current device. The operands must live there.
    timeout: the bound, in seconds, of every wait and exchange; one that runs out raises
        TimeoutError on the rank that waited.
    stop_on_error: when a call fails on this rank alone (a refusal of its own operands, a failure
        while enqueueing), its peers' device waits are stopped, so their calls raise
        tilelink.TimeoutError naming this rank within milliseconds instead of at their timeout;
        the world is then unusable on every rank. Refusals every rank raises alike (ranks that
        call another op or with other options) stop nothing.
    """
    global _INIT
    if not has_cuda:
        raise Error("tilelink.init: this tilelink was built without CUDA (pip install . where nvcc is found)")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError("tilelink.init joins a torch.distributed group: it needs PyTorch (pip install torch)") from e

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tilelink.init: torch.distributed is not initialised: call "
                           "torch.distributed.init_process_group() first (torchrun sets its environment)")
    if group is None:
        group = dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("tilelink.init: this process is not a member of group")
    count = torch.cuda.device_count()
    if count == 0:
        raise Error("tilelink.init: no GPU is visible to this process")
    if device is None:
        local = os.environ.get("LOCAL_RANK")
        device = int(local) % count if local is not None else torch.cuda.current_device()
    if not 0 <= int(device) < count:
        raise ValueError(f"tilelink.init: device {device} does not exist ({count} visible)")
    exchange = _gloo_exchange(group, float(timeout))
    w = ProcessWorld(_tilelink.World(exchange, rank, size, int(device), float(timeout), bool(stop_on_error)))
    _OPEN.add(w)
    _INIT = w
    return w


def world() -> ProcessWorld:
    """The world of the last :func:`init`."""
    if _INIT is None:
        raise RuntimeError("tilelink.init() has not been called in this process (or use tilelink.virtual)")
    return _INIT


def ag_gemm(a: Any, b: Any, *, path: str = "auto", config: Optional[Config] = None, out: Optional[Any] = None) -> Any:
    """AllGather + GEMM on the world of :func:`init`: a = this rank's A_r [M_r, K], b = B_r [N_r, K];
    returns C_r = AllGather(A) B_r^T [M, N_r]."""
    return world().run("ag_gemm", a, b, path=path, config=config, out=out)


def gemm_rs(a: Any, b: Any, *, path: str = "auto", config: Optional[Config] = None, out: Optional[Any] = None) -> Any:
    """GEMM + ReduceScatter on the world of :func:`init`: a = A_r [M, K_r], b = B_r [N, K_r]; returns
    this rank's rows of sum_i A_i B_i^T."""
    return world().run("gemm_rs", a, b, path=path, config=config, out=out)


def gemm_ar(a: Any, b: Any, *, path: str = "auto", config: Optional[Config] = None, out: Optional[Any] = None) -> Any:
    """GEMM + AllReduce on the world of :func:`init`: a = A_r [M, K_r], b = B_r [N, K_r]; returns
    sum_i A_i B_i^T [M, N]."""
    return world().run("gemm_ar", a, b, path=path, config=config, out=out)


def sp_attn(q: Any, k: Any, v: Any, *, causal: bool = False, shard: str = "contiguous", path: str = "auto",
            out: Optional[Any] = None, lse: Optional[Any] = None) -> tuple:
    """Sequence-parallel attention on the world of :func:`init`: this rank's shard q [B, S_r, Hq, D],
    k and v [B, S_r, Hkv, D]; returns (out, lse) of its rows (see World.sp_attn)."""
    return world().sp_attn(q, k, v, causal=causal, shard=shard, path=path, out=out, lse=lse)


def ring_attn(q: Any, k: Any, v: Any, *, causal: bool = False, shard: str = "contiguous", path: str = "auto",
              out: Optional[Any] = None, lse: Optional[Any] = None) -> tuple:
    """Ring attention on the world of :func:`init` (see World.ring_attn)."""
    return world().ring_attn(q, k, v, causal=causal, shard=shard, path=path, out=out, lse=lse)


def moe_mlp(x: Any, topk_ids: Any, topk_weights: Any, w1: Any, w2: Any, *, path: str = "auto",
            out: Optional[Any] = None) -> Any:
    """The tensor-parallel MoE layer on the world of :func:`init`: this rank's tokens x [M_r, H], their
    routing [M_r, topk], its expert shards w1 [E, 2 F_r, H] and w2 [E, H, F_r]; returns [M_r, H]
    (see World.moe_mlp)."""
    return world().moe_mlp(x, topk_ids, topk_weights, w1, w2, path=path, out=out)


def moe_ag_gemm(x: Any, topk_ids: Any, topk_weights: Any, w1: Any, *, tokens: Optional[int] = None,
                path: str = "auto", out: Optional[Any] = None) -> Any:
    """MoE layer 0 on the world of :func:`init` (see ProcessWorld.moe_ag_gemm)."""
    return world().moe_ag_gemm(x, topk_ids, topk_weights, w1, tokens=tokens, path=path, out=out)


def moe_gemm_rs(h1: Any, topk_ids: Any, topk_weights: Any, w2: Any, *, m_split: Optional[Sequence[int]] = None,
                path: str = "auto", out: Optional[Any] = None) -> Any:
    """MoE layer 1 on the world of :func:`init` (see ProcessWorld.moe_gemm_rs)."""
    return world().moe_gemm_rs(h1, topk_ids, topk_weights, w2, m_split=m_split, path=path, out=out)


def _add_op_function(name: str, summary: str) -> None:
    def function(a: Any, b: Any, *, path: str = "auto", config: Optional[Config] = None,
                 out: Optional[Any] = None) -> Any:
        return world().run(name, a, b, path=path, config=config, out=out)

    function.__name__ = name
    function.__doc__ = f"{summary}, on the world of init(). See ProcessWorld.run."
    globals()[name] = function


for _spec in _tilelink.ops():
    if _spec["name"] not in globals():
        _add_op_function(_spec["name"], _spec["summary"])
