"""Run by ctest under `mpirun -np 2`: the same shard_map script as with threads, one device
per process over MPI, and a failing device stopping both processes."""
import os

import numpy as np

import distjax as dj
from distjax import P

mesh = dj.Mesh((2,), ("data",))
x = np.arange(8, dtype=np.float32)


def body(xl):
    grads = dj.value_and_grad(lambda v: dj.sum(dj.square(v)))(xl)[1]
    return dj.psum(dj.sum(xl), "data"), dj.all_gather_invariant(grads, "data", tiled=True)


total, grads = dj.shard_map(body, mesh, in_specs=P("data"), out_specs=(P(), P()))(x)
assert total.gather().item() == 28.0, total.gather().item()
np.testing.assert_array_equal(grads.gather().numpy(), 2 * x)
threads = dj.shard_map(body, mesh, in_specs=P("data"), out_specs=(P(), P()), backend="threads")(x)
assert threads[0].gather().item() == 28.0


def failing(xl):
    if dj.axis_index("data") == 1:
        raise ValueError("device 1 fails on purpose")
    return dj.psum(xl, "data")


rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
try:
    dj.shard_map(failing, mesh, in_specs=P("data"), out_specs=P("data"), timeout_s=20)(x)
    raise AssertionError("the failure was not raised")
except (ValueError, dj.CommError) as e:
    # The failing process raises its own exception; the other learns of it in its psum.
    assert isinstance(e, ValueError if rank == 1 else dj.CommError), repr(e)
    assert "device 1" in str(e) + "".join(getattr(e, "__notes__", [])), repr(e)
    print(f"rank {rank} raised:", type(e).__name__, str(e).splitlines()[0])
print("ok: shard_map over MPI")
