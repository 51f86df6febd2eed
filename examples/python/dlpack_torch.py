"""A DLPack round trip with PyTorch: one memory, no copies. Run: python dlpack_torch.py"""
import torch
import torch.utils.dlpack

import distjax as dj

t = torch.linspace(-1, 1, 8).reshape(2, 4)
x = dj.from_dlpack(t)  # a DistJax tensor over PyTorch's memory
print("same memory:", x.data_ptr == t.data_ptr())
y = dj.nn.softmax(x)  # computed by DistJax
u = torch.utils.dlpack.from_dlpack(y)  # a PyTorch tensor over DistJax's memory
print("same memory:", u.data_ptr() == y.data_ptr)
print("matches torch.softmax:", torch.allclose(u, torch.softmax(t, dim=-1)))
