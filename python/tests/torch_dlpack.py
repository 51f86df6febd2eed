"""PyTorch's torch.utils.dlpack both ways with DistJax tensors, without copies (run by ctest
with the system's Python, where Debian's python3-torch lives). Exit 77: skipped (no torch,
or a module built for another Python), unless DISTJAX_REQUIRE_TORCH=1."""
import os
import sys


def skip(why):
    print(f"skipped: {why}")
    sys.exit(1 if os.environ.get("DISTJAX_REQUIRE_TORCH") == "1" else 77)


try:
    import torch
    import torch.utils.dlpack
except ImportError:
    skip("no torch in " + sys.executable)
try:
    import distjax as dj
except ImportError as e:
    skip(f"distjax's module does not load in {sys.executable}: {e}")

# PyTorch -> DistJax: the same memory, kept alive by the tensor.
t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
x = dj.from_dlpack(torch.utils.dlpack.to_dlpack(t) if not hasattr(t, "__dlpack__") else t)
assert x.data_ptr == t.data_ptr(), (x.data_ptr, t.data_ptr())
assert x.shape == (3, 4)
t[0, 0] = 42.0
assert dj.sum(x).item() == sum(range(12)) + 42.0
del t

# DistJax -> PyTorch: the same memory, kept alive by the PyTorch tensor.
y = x * 2.0
u = torch.utils.dlpack.from_dlpack(y)
assert u.data_ptr() == y.data_ptr
ptr = y.data_ptr
del y
assert u.data_ptr() == ptr and u[0, 0].item() == 84.0
for dtype in (torch.float16, torch.bfloat16, torch.int32, torch.int64):
    v = torch.arange(6).to(dtype)
    w = torch.utils.dlpack.from_dlpack(dj.from_dlpack(v))
    assert w.dtype == dtype and w.data_ptr() == v.data_ptr() and torch.equal(w, v), dtype
print("ok: PyTorch and DistJax exchanged tensors through DLPack without copies")
