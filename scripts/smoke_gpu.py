"""Smoke check of the load mechanism on a GPU machine: an executable.so built on a machine with no GPU
(another Python) loads through tvm_ffi, runs on torch tensors, and is captured by a CUDA graph on
torch's current stream."""
import sys, time, json, os, glob, platform
import torch
t0 = time.time(); import tilelang, tvm_ffi; print("import tilelang", round(time.time() - t0, 2), "s", platform.python_version(), torch.__version__)
so = sys.argv[1]
mod = tvm_ffi.load_module(so); fn = mod["main"]
T_, H = 37, 4096
x = torch.randn(T_, H, device="cuda", dtype=torch.bfloat16); y = torch.empty_like(x)
fn(x, y); torch.cuda.synchronize()
print("eager ok:", torch.equal(y, x * 2))
s = torch.cuda.Stream(); g = torch.cuda.CUDAGraph()
y.zero_()
with torch.cuda.stream(s):
    fn(x, y)  # warm on side stream
torch.cuda.synchronize()
with torch.cuda.graph(g):
    fn(x, y)
x.copy_(torch.randn_like(x)); y.zero_(); g.replay(); torch.cuda.synchronize()
print("graph replay ok:", torch.equal(y, x * 2))
