"""libai.utils.distributed's LiBai helpers on 2 ranks (run by tests/libai_compat/test_libai_names.py):
ttol / tton / tensor_to_rank0 / convert_to_distributed_default_setting on split global tensors."""
import numpy as np

import engine as flow
import libai.utils.distributed as dist

rank = dist.get_rank()
assert dist.get_world_size() == 2 and dist.is_last_process() == (rank == 1) and dist.get_num_nodes() == 1
assert dist.broadcast_py_object({"from": rank}, src=1) == {"from": 1}

x = np.arange(12.0).reshape(4, 3)
S, B = flow.sbp.split, flow.sbp.broadcast
world = flow.placement("cpu", [0, 1])
g = flow.tensor(x[2 * rank:2 * rank + 2]).to_global(placement=world, sbp=[S(0)])  # the logical x, split
np.testing.assert_array_equal(dist.tton(g), x)                               # the whole value on every rank
np.testing.assert_array_equal(dist.tton(g, local_only=True), x[2 * rank:2 * rank + 2])  # this rank's shard
np.testing.assert_array_equal(dist.ttol(g).numpy(), x)
only0 = dist.ttol(g, ranks=[0])                      # gathered onto rank 0; rank 1 holds nothing of it
assert not only0.is_global and tuple(only0.shape) == ((4, 3) if rank == 0 else (0,))
if rank == 0:
    np.testing.assert_array_equal(only0.numpy(), x)
r0 = dist.tensor_to_rank0(g)
assert r0.placement.ranks == [0] and r0.sbp == (B,)
on0 = dist.tensor_to_rank0(g, to_local=True)
assert tuple(on0.shape) == ((4, 3) if rank == 0 else (0,))
if rank == 0:
    np.testing.assert_array_equal(on0.numpy(), x)

local = dist.convert_to_distributed_default_setting(flow.tensor(x))         # replicated over layer 0's ranks
assert local.placement.ranks == [0, 1] and local.sbp == (B,)
np.testing.assert_array_equal(local.to_local().numpy(), x)
moved = dist.convert_to_distributed_default_setting(g)                       # a global one keeps its SBP
assert moved.sbp == (S(0),) and moved.placement.ranks == [0, 1]
print(f"rank {rank}: ok")
