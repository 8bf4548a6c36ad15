"""GPU benchmarks on one CUDA device: concord's CUDA kernels and NCCL path
against torch and raw NCCL.

    python3 bench/gpu.py            # a few minutes on an H200
    python3 bench/gpu.py --quick

Without a CUDA device (or without torch) it says so and exits 0. Every time
is a median over repeats measured with CUDA events on the current stream,
after warm-up. Bandwidths count bytes read plus bytes written, and are also
shown as a fraction of the device copy bandwidth measured first (target for
memory-bound kernels: >= 0.8 of it). Sections:

(a) copy: torch dst.copy_(src) of 256 MiB;
(b) multi-tensor memory passes over ResNet-50's 161 float32 gradients
    (25.6M values): torch.cat (pack), torch._foreach_copy_ (unpack, and the
    float32 -> bfloat16 cast), torch._foreach_mul_ (scale) against concord's
    scale kernel and GradientSynchronizer on a world of one (pack, all-reduce,
    unpack; pack and unpack have no Python entry of their own), with and
    without bf16 compression; torch's and concord's clip_grad_norm. Without
    compression only gradients under 256 KiB are packed (larger ones are
    all-reduced where they are, which on one rank leaves them as they are):
    that row counts the packed gradients' bytes only, and gives no verdict;
(c) one AdamW step over four copies of those tensors (102M values):
    concord.optim.AdamW against torch.optim.AdamW(fused=True) and
    (foreach=True); 7 x 4 bytes per value (params, grads, exp_avg, exp_avg_sq
    read; params, exp_avg, exp_avg_sq written);
(d) out-of-place sum all_reduce of float32 on a world of one, 8 B to
    256 MiB: concord from Python (cc.all_reduce(x, out=y)) against raw NCCL
    called from C (bench/nccl_raw.c, compiled here with nvcc) on the same
    send and receive buffers and stream. On one rank an in-place all_reduce
    does no device work; out of place each call copies the buffer into the
    receive buffer on the device. Both time `iters` back-to-back calls
    between two CUDA events with one synchronisation at the end, so when
    enqueueing is slower than the GPU the time is the host's pace. Targets:
    concord's overhead over raw NCCL < 10 us per call; algbw (size / time)
    at least 0.97 of raw NCCL's from 1 MiB up;
(e) metric updates on the GPU, 1M samples: Accuracy over 1000-class scores
    and ConfusionMatrix over 1000-class labels, concord against torchmetrics
    (when installed) on the same CUDA tensors.

A section that fails (a feature without a CUDA path, a missing compiler)
prints why and the others still run.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import _timing
from grad_sync import NUMEL, SHAPES

NO_DEVICE = "no CUDA device: bench/gpu.py needs one; nothing measured"
HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
COPY_BYTES = 256 * MiB
TARGET_OF_COPY = 0.8
TARGET_OVERHEAD_US = 10.0
TARGET_ALGBW_RATIO = 0.97
NCCL_FLOAT32 = 7  # ncclFloat32 in nccl.h
# GradientSynchronizer packs uncompressed gradients smaller than this and
# all-reduces larger ones where they are (kDirectBytes in
# libcore/dp/grad_sync.hpp).
PACKED_BELOW_BYTES = 256 * 1024
ADAMW_COPIES = 4  # four ResNet-50s: about 100M parameters
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
METRIC_SAMPLES = 1_000_000
METRIC_CLASSES = 1000


@dataclass(frozen=True)
class Mode:
    repeats: int
    warmup: int
    allreduce_sizes: tuple[int, ...]
    allreduce_repeats: int


def _sizes(largest: int) -> tuple[int, ...]:
    sizes, size = [], 8
    while size < largest:
        sizes.append(size)
        size *= 8
    return (*sizes, largest)


FULL = Mode(repeats=15, warmup=5, allreduce_sizes=_sizes(256 * MiB), allreduce_repeats=7)
QUICK = Mode(repeats=5, warmup=2, allreduce_sizes=_sizes(64 * MiB), allreduce_repeats=3)


# ---------------------------------------------------------------- timing


def median_ms(torch, fn: Callable[[], object], mode: Mode, inner: int = 1) -> float:
    """Median over mode.repeats of the CUDA-event time of `inner` calls of
    fn on the current stream, per call, in milliseconds."""
    for _ in range(mode.warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(mode.repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def section(title: str, fn: Callable, *args) -> object:
    """Runs one section; a failure prints why and lets the next one run."""
    print(f"\n{title}", flush=True)
    try:
        return fn(*args)
    except Exception as exc:  # a benchmark reports, it does not stop
        last = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"  not measured: {type(exc).__name__}: {exc} "
              f"({os.path.basename(last.filename)}:{last.lineno})")
        return None
    finally:
        import torch

        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as exc:  # a sticky CUDA error: later sections will say so too
            print(f"  after this section the device reports: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- (a) copy


def copy_bandwidth(torch, mode: Mode) -> float:
    src = torch.ones(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(torch, lambda: dst.copy_(src), mode)
    bandwidth = gbps(2 * COPY_BYTES, ms)
    print(_timing.format_table(["bytes", "ms", "GB/s (read + write)"],
                               [[_timing.format_bytes(COPY_BYTES), f"{ms:.3f}",
                                 f"{bandwidth:.0f}"]]))
    return bandwidth


# ---------------------------------------------------------------- (b) multi-tensor passes


def multi_tensor(torch, mode: Mode, copy_gbps: float) -> None:
    from concord import _capi, optim
    from concord.training import GradientSynchronizer

    import concord as cc

    n = NUMEL
    tensors = [torch.randn(shape, device="cuda") for shape in SHAPES]
    sizes = [t.numel() for t in tensors]
    flat = torch.empty(n, device="cuda")
    flat16 = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    views = [v.view(t.shape) for v, t in zip(flat.split(sizes), tensors)]
    views16 = [v.view(t.shape) for v, t in zip(flat16.split(sizes), tensors)]
    factor = 0.9999999  # values barely change over the repeats
    rows, notes = [], []

    def add(operation, implementation, fn, nbytes, concord_row=False):
        try:
            ms = median_ms(torch, fn, mode)
        except Exception as exc:
            rows.append([operation, implementation, "-", "-", "-", "-"])
            notes.append(f"{implementation} ({operation}): {type(exc).__name__}: {exc}")
            return None
        bandwidth = gbps(nbytes, ms)
        share = bandwidth / copy_gbps
        rows.append([operation, implementation, f"{ms:.3f}", f"{bandwidth:.0f}", f"{share:.2f}",
                     verdict(share >= TARGET_OF_COPY) if concord_row else ""])
        return ms

    add("pack", "torch.cat", lambda: torch.cat([t.view(-1) for t in tensors], out=flat), 8 * n)
    add("unpack", "torch._foreach_copy_", lambda: torch._foreach_copy_(tensors, views), 8 * n)
    add("pack + cast to bf16", "torch._foreach_copy_",
        lambda: torch._foreach_copy_(views16, tensors), 6 * n)
    add("unpack from bf16", "torch._foreach_copy_",
        lambda: torch._foreach_copy_(tensors, views16), 6 * n)
    add("cast f32 -> bf16, one tensor", "torch copy_", lambda: flat16.copy_(flat), 6 * n)
    add("scale", "torch._foreach_mul_", lambda: torch._foreach_mul_(tensors, factor), 8 * n)
    add("scale", "concord (_capi.scale)", lambda: _capi.scale(tensors, factor), 8 * n, True)

    packed = [t for t in tensors if t.numel() * t.element_size() < PACKED_BELOW_BYTES]
    packed_n = sum(t.numel() for t in packed)
    print("  pack/unpack have no Python entry of their own: concord's are measured inside "
          "GradientSynchronizer on a world of one (pack, 1-rank all_reduce, unpack; bytes counted "
          "for pack and unpack only). Without compression only the gradients under "
          f"{PACKED_BELOW_BYTES // 1024} KiB are packed ({len(packed)} of {len(tensors)}, "
          f"{packed_n / 1e6:.2f}M values); the others are all-reduced where they are, which on "
          "one rank moves nothing, so that row counts the packed ones' bytes and, too little "
          "data to approach the copy bandwidth, gets no verdict")
    if not cc.is_initialized():
        cc.init()
    for compress, wire in ((None, 4), ("bf16", 2)):
        if compress is None:
            label = (f"pack + all_reduce + unpack, f32 (bytes of the {len(packed)} "
                     f"< {PACKED_BELOW_BYTES // 1024} KiB)")
            nbytes, with_verdict = 2 * (4 + wire) * packed_n, False
        else:
            label = "pack + all_reduce + unpack, bf16 wire (bytes of all)"
            nbytes, with_verdict = 2 * (4 + wire) * n, True
        try:
            with GradientSynchronizer(tensors, reduce="sum", compress=compress) as sync:
                add(label, "concord GradientSynchronizer", lambda: sync.synchronize(tensors),
                    nbytes, with_verdict)
        except Exception as exc:
            rows.append([label, "concord GradientSynchronizer", "-", "-", "-", "-"])
            notes.append(f"GradientSynchronizer compress={compress}: {type(exc).__name__}: {exc}")

    # Clipping reads every gradient for the norm, then scales them all.
    params = [torch.nn.Parameter(torch.empty_like(t)) for t in tensors]
    for p, t in zip(params, tensors):
        p.grad = t
    total = float(torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(t) for t in tensors])))
    max_norm = 0.5 * total
    add("clip_grad_norm", "torch (foreach)",
        lambda: torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True), 12 * n)
    add("clip_grad_norm", "concord", lambda: optim.clip_grad_norm(tensors, max_norm), 12 * n, True)

    print(_timing.format_table(["operation", "implementation", "ms", "GB/s", "of copy",
                                f">= {TARGET_OF_COPY}"], rows))
    for note in notes:
        print(f"  note: {note}")


# ---------------------------------------------------------------- (c) AdamW


def _concord_adamw(torch, params, grads):
    from concord import optim

    opt = optim.AdamW(LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    state = {"opt": opt.init(params)}

    def step():
        _, state["opt"] = opt.step(params, grads, state["opt"])

    step.params = params
    return step


def _torch_adamw(**flags):
    def make(torch, params, grads):
        leaves = [torch.nn.Parameter(p) for p in params]
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        opt = torch.optim.AdamW(leaves, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                **flags)

        def step():
            with torch.no_grad():
                opt.step()

        step.params = leaves
        return step

    return make


ADAMW_IMPLEMENTATIONS = [("concord fused", _concord_adamw),
                         ("torch fused", _torch_adamw(fused=True)),
                         ("torch foreach", _torch_adamw(foreach=True))]


def adamw(torch, mode: Mode, copy_gbps: float) -> None:
    shapes = SHAPES * ADAMW_COPIES
    n = NUMEL * ADAMW_COPIES
    traffic = 7 * 4 * n
    generator = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(s, device="cuda", generator=generator) for s in shapes]
    grads = [torch.randn(s, device="cuda", generator=generator) for s in shapes]
    print(f"  {len(shapes)} float32 tensors, {n / 1e6:.1f}M values, "
          f"{traffic / 1e9:.2f} GB of traffic per step")
    rows, results = [], {}
    for name, make in ADAMW_IMPLEMENTATIONS:
        try:
            step = make(torch, [p.clone() for p in params], grads)
            ms = median_ms(torch, step, mode)
        except Exception as exc:
            rows.append([name, "-", "-", "-", "-", f"unavailable: {type(exc).__name__}: "
                         f"{str(exc)[:60]}"])
            continue
        results[name] = ms
        del step
        torch.cuda.empty_cache()
        bandwidth = gbps(traffic, ms)
        rows.append([name, f"{ms:.2f}", f"{bandwidth:.0f}", f"{bandwidth / copy_gbps:.2f}", "", ""])
    fused = results.get("concord fused")
    for row in rows:
        if row[0] in results and fused is not None:
            row[4] = f"{results[row[0]] / fused:.2f}"
    for row in rows:
        if row[0] == "concord fused" and fused is not None:
            row[5] = verdict(gbps(traffic, fused) / copy_gbps >= TARGET_OF_COPY)
    print(_timing.format_table(["implementation", "ms/step", "GB/s", "of copy", "x/concord",
                                f"check (>= {TARGET_OF_COPY} of copy)"], rows))
    if "concord fused" in results and "torch fused" in results:
        worst = _adamw_difference(torch, params, grads)
        print(f"  after 3 steps from the same start, max |concord - torch fused| = {worst:.1e}"
              + ("  MISMATCH" if worst > 1e-5 else ""))


def _adamw_difference(torch, params, grads) -> float:
    finals = []
    for _, make in ADAMW_IMPLEMENTATIONS[:2]:
        step = make(torch, [p.clone() for p in params], grads)
        for _ in range(3):
            step()
        finals.append([p.detach() for p in step.params])
    return max(float((a - b).abs().max()) for a, b in zip(*finals) if a.numel())


# ---------------------------------------------------------------- (d) all_reduce


def _nccl_candidates(build_info: dict) -> list[tuple[str, str]]:
    """(include dir, lib dir) pairs where nccl.h and libnccl may be, the
    NCCL concord loaded first."""
    pairs = []
    nccl = build_info.get("nccl") or {}
    path = nccl.get("library") or nccl.get("path") or ""
    if path:
        lib = os.path.dirname(path)
        pairs.append((os.path.join(os.path.dirname(lib), "include"), lib))
    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is not None:
        for root in spec.submodule_search_locations or []:  # a namespace package: __path__
            pairs.append((os.path.join(root, "include"), os.path.join(root, "lib")))
    for root in ("/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        for lib in ("lib", "lib64", "targets/x86_64-linux/lib"):
            pairs.append((os.path.join(root, "include"), os.path.join(root, lib)))
    pairs.append(("/usr/include", "/usr/lib/x86_64-linux-gnu"))
    return pairs


def _find_nccl(build_info: dict) -> tuple[str, str, str]:
    """(include dir, lib dir, linker flag): the first libnccl of the
    candidates, with the nccl.h next to it, else the first nccl.h found
    (NCCL's API is stable across these versions)."""
    candidates = _nccl_candidates(build_info)
    headers = [include for include, _ in candidates
               if os.path.exists(os.path.join(include, "nccl.h"))]
    for include, lib in candidates:
        for name, flag in (("libnccl.so", "-lnccl"), ("libnccl.so.2", "-l:libnccl.so.2")):
            if os.path.exists(os.path.join(lib, name)):
                if include in headers:
                    return include, lib, flag
                if headers:
                    return headers[0], lib, flag
    raise FileNotFoundError("no libnccl with an nccl.h (looked where concord found NCCL, in the "
                            "nvidia-nccl wheel, /usr/local/cuda*, /usr)")


def _compile_raw_nccl(workdir: str, build_info: dict) -> ctypes.CDLL:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        raise FileNotFoundError("nvcc not found (PATH, /usr/local/cuda/bin)")
    include, lib, flag = _find_nccl(build_info)
    cuda_include = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
                                "include")
    output = os.path.join(workdir, "libnccl_raw.so")
    command = [nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", f"-I{include}", f"-I{cuda_include}",
               "-o", output, os.path.join(HERE, "nccl_raw.c"), f"-L{lib}", flag, "-lcudart",
               "-Xlinker", f"-rpath,{lib}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    library = ctypes.CDLL(output)
    library.nccl_raw_allreduce_us.restype = ctypes.c_double
    # (send, recv, count, dtype, stream, warmup, iters, host_us)
    library.nccl_raw_allreduce_us.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                              ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    library.nccl_raw_last_error.restype = ctypes.c_char_p
    library.nccl_raw_version.restype = ctypes.c_int
    library.nccl_raw_finalize.restype = ctypes.c_int
    print(f"  raw NCCL: {' '.join(command[:2])} ... {flag} from {lib} "
          f"(NCCL {library.nccl_raw_version()})")
    return library


def _iters_for(nbytes: int) -> int:
    if nbytes <= MiB:
        return 2000
    if nbytes <= 16 * MiB:
        return 300
    return 50


def _raw_us(library, x, y, stream, iters: int) -> tuple[float, float]:
    """Raw NCCL's all-reduce of x into y: (us per call, host us per call)."""
    host = ctypes.c_double(0.0)
    us = library.nccl_raw_allreduce_us(ctypes.c_void_p(x.data_ptr()),
                                       ctypes.c_void_p(y.data_ptr()), x.numel(), NCCL_FLOAT32,
                                       ctypes.c_void_p(stream.cuda_stream), 20, iters,
                                       ctypes.byref(host))
    if us < 0:
        raise RuntimeError(f"nccl_raw_allreduce_us: {library.nccl_raw_last_error().decode()}")
    return us, host.value


def _concord_us(torch, cc, x, y, iters: int) -> tuple[float, float]:
    """concord's all-reduce of x into y: (us per call, host us per call)."""
    for _ in range(20):
        cc.all_reduce(x, out=y)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    host_start = time.perf_counter()
    for _ in range(iters):
        cc.all_reduce(x, out=y)
    host_s = time.perf_counter() - host_start
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters, host_s * 1e6 / iters


def all_reduce(torch, mode: Mode) -> None:
    import concord as cc

    if not cc.is_initialized():
        cc.init()
    notes = []
    library = None
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        try:
            library = _compile_raw_nccl(workdir, cc.build_info())
        except Exception as exc:
            notes.append(f"raw NCCL not measured: {type(exc).__name__}: {exc}")
        stream = torch.cuda.current_stream()
        concord_ok = True
        rows = []
        for nbytes in mode.allreduce_sizes:
            # Out of place: on one rank each call copies x into y on the
            # device (in place there would be nothing to do).
            x = torch.ones(max(1, nbytes // 4), device="cuda")
            y = torch.empty_like(x)
            iters = _iters_for(nbytes)
            raw, ours = [], []
            for _ in range(mode.allreduce_repeats):
                if library is not None:
                    try:
                        raw.append(_raw_us(library, x, y, stream, iters))
                    except Exception as exc:
                        notes.append(f"{_timing.format_bytes(nbytes)} raw NCCL: {exc}")
                        library = None
                if concord_ok:
                    try:
                        ours.append(_concord_us(torch, cc, x, y, iters))
                    except Exception as exc:
                        notes.append(f"{_timing.format_bytes(nbytes)} concord: "
                                     f"{type(exc).__name__}: {exc}")
                        concord_ok = False
            if not ours and not raw:
                break
            rows.append(_allreduce_row(nbytes, raw, ours))
        if library is not None:
            library.nccl_raw_finalize()
    print(_timing.format_table(
        ["size", "concord us", "raw NCCL us", "overhead us", "host us cc/raw", "algbw cc GB/s",
         "algbw raw GB/s", "cc/raw", f"overhead < {TARGET_OVERHEAD_US:g} us",
         f">= {TARGET_ALGBW_RATIO} (1 MiB up)"], rows))
    print("  us: per call, CUDA events around back-to-back calls; host us: time the host "
          "spent issuing each call; overhead = concord us - raw NCCL us; algbw = size / time, "
          "each call copying size bytes from the send buffer into the receive buffer")
    for note in notes:
        print(f"  note: {note}")


def _allreduce_row(nbytes: int, raw: list, ours: list) -> list[str]:
    def med(values, index):
        return statistics.median(v[index] for v in values) if values else None

    cc_us, cc_host = med(ours, 0), med(ours, 1)
    raw_us, raw_host = med(raw, 0), med(raw, 1)
    size = _timing.format_bytes(nbytes)
    row = [size, "-", "-", "-", "-", "-", "-", "-", "", ""]
    if cc_us is not None:
        row[1] = f"{cc_us:.2f}"
        row[5] = f"{nbytes / (cc_us * 1e-6) / 1e9:.2f}"
    if raw_us is not None:
        row[2] = f"{raw_us:.2f}"
        row[6] = f"{nbytes / (raw_us * 1e-6) / 1e9:.2f}"
    if cc_us is not None and raw_us is not None:
        overhead = cc_us - raw_us
        ratio = raw_us / cc_us  # algbw ratio concord / raw
        row[3] = f"{overhead:.2f}"
        row[4] = f"{cc_host:.1f}/{raw_host:.1f}"
        row[7] = f"{ratio:.3f}"
        row[8] = verdict(overhead < TARGET_OVERHEAD_US)
        row[9] = verdict(ratio >= TARGET_ALGBW_RATIO) if nbytes >= MiB else ""
    return row


# ---------------------------------------------------------------- (e) metrics


def metric_updates(torch, mode: Mode) -> None:
    from concord import metrics as M

    generator = torch.Generator(device="cuda").manual_seed(0)
    n, classes = METRIC_SAMPLES, METRIC_CLASSES
    scores = torch.rand((n, classes), device="cuda", generator=generator)
    target = torch.randint(0, classes, (n,), device="cuda", generator=generator)
    preds = torch.randint(0, classes, (n,), device="cuda", generator=generator)
    have_torchmetrics = importlib.util.find_spec("torchmetrics") is not None
    cases = [(f"Accuracy, ({n:,}, {classes}) scores",
              lambda: M.Accuracy("multiclass", num_classes=classes), (scores, target),
              "MulticlassAccuracy", dict(num_classes=classes, average="micro")),
             (f"ConfusionMatrix, {classes} classes, ({n:,},) labels",
              lambda: M.ConfusionMatrix(classes), (preds, target),
              "MulticlassConfusionMatrix", dict(num_classes=classes))]
    rows, notes = [], []
    for label, make, args, tm_name, tm_kwargs in cases:
        ours = theirs = None
        try:
            metric = make()
            ours = median_ms(torch, lambda: metric.update(*args), mode)
        except Exception as exc:
            notes.append(f"concord {label}: {type(exc).__name__}: {exc}")
        if have_torchmetrics:
            try:
                import torchmetrics.classification as tmc

                peer = getattr(tmc, tm_name)(**tm_kwargs).to("cuda")
                theirs = median_ms(torch, lambda: peer.update(*args), mode)
            except Exception as exc:
                notes.append(f"torchmetrics {label}: {type(exc).__name__}: {exc}")
        rows.append([label, "-" if ours is None else f"{n / (ours * 1e-3) / 1e6:.0f}",
                     "-" if theirs is None else f"{n / (theirs * 1e-3) / 1e6:.0f}",
                     f"{theirs / ours:.1f}" if ours and theirs else "-"])
    print(_timing.format_table(["metric update", "concord M samples/s",
                                "torchmetrics M samples/s", "cc/tm"], rows))
    if not have_torchmetrics:
        print("  torchmetrics not installed (pip install torchmetrics): its column is empty")
    for note in notes:
        print(f"  note: {note}")


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, sizes up to 64 MiB")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(NO_DEVICE)
        return 0
    if not torch.cuda.is_available():
        print(NO_DEVICE)
        return 0
    import concord as cc

    mode = QUICK if args.quick else FULL
    info = cc.build_info()
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB, "
          f"compute capability {props.major}.{props.minor}); torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}); concord {cc.__version__}, cuda {info.get('cuda')}, "
          f"nccl {info.get('nccl')}; load average {os.getloadavg()[0]:.2f}")
    print(f"medians of {mode.repeats} repeats after {mode.warmup} warm-up calls, CUDA events")

    copy_gbps = section("(a) device copy bandwidth (torch dst.copy_(src))", copy_bandwidth,
                        torch, mode)
    if not copy_gbps:
        print("  the copy bandwidth is the yardstick of (b) and (c): stopping")
        return 1
    section(f"(b) multi-tensor passes over ResNet-50's {len(SHAPES)} float32 tensors "
            f"({NUMEL / 1e6:.1f}M values), as a fraction of the copy bandwidth",
            multi_tensor, torch, mode, copy_gbps)
    section(f"(c) one AdamW step, {ADAMW_COPIES} x ResNet-50", adamw, torch, mode, copy_gbps)
    section("(d) all_reduce (sum, out of place, float32) on a world of one: concord vs raw NCCL",
            all_reduce, torch, mode)
    section(f"(e) metric updates on the GPU, {METRIC_SAMPLES:,} samples", metric_updates,
            torch, mode)
    if cc.is_initialized():
        cc.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
