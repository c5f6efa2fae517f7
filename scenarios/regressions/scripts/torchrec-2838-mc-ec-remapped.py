# TorchRec #2838, as a script cell (scenarios/regressions/torchrec-2838-mc-ec-one-table-remapped.yaml):
# a sharded ManagedCollisionEmbeddingCollection with return_remapped_features=True and ONE table
# raises IndexError in its forward; with two tables it works.  Written for dmpcheck from the
# report's description (the reporter's own script was not readable); CPU and Gloo; it exits 1
# when the forward raises.  NUM_TABLES=2 is the reporter's working control.
import os, sys, traceback, inspect
import torch
import torch.distributed as dist
import torchrec
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingType
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy, ManagedCollisionCollection, MCHManagedCollisionModule,
)
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection
from torchrec.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder


def _cpu_placement_shim():
    # torchrec 0.7/0.8 ShardedManagedCollisionCollection hard-codes "rank:N/cuda:M" placement for its
    # MC buffers (distributed/mc_modules.py _initialize_torch_state). On a CPU-only box torch rejects
    # that Shard. This shim rewrites the placement device to the tensor's real device (cpu) and
    # changes nothing else. It is a no-op where torchrec already uses the right device.
    from torch.distributed._shard.sharded_tensor.shard import Shard
    from torch.distributed import _remote_device
    orig = Shard.__post_init__
    def post_init(self):
        pl = self.metadata.placement
        if pl is not None and pl.device() != self.tensor.device:
            self.metadata.placement = _remote_device(f"rank:{pl.rank()}/{self.tensor.device}")
        orig(self)
    Shard.__post_init__ = post_init


def main():
    if os.environ.get("CPU_SHIM", "1") == "1":
        _cpu_placement_shim()
    dist.init_process_group(backend="gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ntables = int(os.environ.get("NUM_TABLES", "1"))
    tables = [
        EmbeddingConfig(name=f"t{i}", embedding_dim=4, num_embeddings=16, feature_names=[f"f{i}"])
        for i in range(ntables)
    ]
    ec = EmbeddingCollection(tables=tables, device=torch.device("meta"))
    extra = {}
    if "buckets" in inspect.signature(MCHManagedCollisionModule.__init__).parameters:
        extra["buckets"] = ws  # newer releases require buckets divisible across ranks for the planner
    mcc = ManagedCollisionCollection(
        managed_collision_modules={
            t.name: MCHManagedCollisionModule(
                zch_size=16, device=torch.device("meta"), eviction_interval=1,
                eviction_policy=DistanceLFU_EvictionPolicy(), input_hash_size=1000, **extra,
            )
            for t in tables
        },
        embedding_configs=tables,
    )
    mc_ec = ManagedCollisionEmbeddingCollection(ec, mcc, return_remapped_features=True)
    sharders = [ManagedCollisionEmbeddingCollectionSharder()]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=ws, compute_device="cpu"),
        constraints={t.name: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value], compute_kernels=["fused"]) for t in tables},
    )
    plan = planner.collective_plan(mc_ec, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(mc_ec, device=torch.device("cpu"), plan=plan, sharders=sharders)
    print(f"[rank{rank}] torchrec {torchrec.__version__} torch {torch.__version__} num_tables={ntables}", flush=True)

    keys = [f"f{i}" for i in range(ntables)]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor([101, 202, 303, 404] * ntables),
        lengths=torch.tensor([2, 2] * ntables),
    )
    try:
        emb, remapped = model(kjt)
        print(f"[rank{rank}] forward OK; remapped keys={remapped.keys()} values={remapped.values().tolist()}", flush=True)
        ok = True
    except Exception as e:
        traceback.print_exc()
        print(f"[rank{rank}] forward raised {type(e).__name__}: {e}", flush=True)
        ok = False
    dist.destroy_process_group() if ok else None
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
