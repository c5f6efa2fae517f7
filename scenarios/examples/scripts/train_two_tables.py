# A user's training script as a bug report brings it, for scenarios/examples/script_cell.yaml: two
# tables, one data-parallel and one table-wise, wrapped by DistributedModelParallel and trained a few
# steps with a fused in-backward optimizer and a dense Adam, on CPU with Gloo when there is no GPU.
# dmpcheck runs it unchanged on every rank (torchrun's variables) and audits every replicated tensor.
import argparse
import os

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.optim import optimizers
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

rank = int(os.environ["RANK"])
device = torch.device("cpu")
dist.init_process_group(backend="gloo")
world_size = dist.get_world_size()

tables = [
    torchrec.EmbeddingBagConfig(name="replicated", embedding_dim=8, num_embeddings=64, feature_names=["f0"]),
    torchrec.EmbeddingBagConfig(name="sharded", embedding_dim=8, num_embeddings=64, feature_names=["f1"]),
]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.linear = torch.nn.Linear(16, 1)

    def forward(self, kjt):
        return self.linear(self.ebc(kjt).values()).mean()


torch.manual_seed(0)
model = Model()
apply_optimizer_in_backward(optimizers.SGD, model.ebc.parameters(), {"lr": 0.1})
constraints = {"replicated": ParameterConstraints(sharding_types=["data_parallel"]),
               "sharded": ParameterConstraints(sharding_types=["table_wise"])}
planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                   constraints=constraints)
sharders = [EmbeddingBagCollectionSharder()]
plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=device)
dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                              lambda params: torch.optim.Adam(params, lr=0.01))
optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])

generator = torch.Generator().manual_seed(100 + rank)
for step in range(args.steps):
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.randint(0, 64, (8,), generator=generator),
                            lengths=torch.ones(8, dtype=torch.int32))
    loss = dmp(kjt)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print("rank %d step %d loss %.6f" % (rank, step + 1, loss.item()))
dist.barrier()
