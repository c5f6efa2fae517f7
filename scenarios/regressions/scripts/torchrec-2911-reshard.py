# TorchRec PR #2911, as a script cell (scenarios/regressions/torchrec-2911-reshard-stale-dims.yaml):
# EmbeddingBagCollectionSharder.reshard moves table-wise shards between ranks in place; the
# ShardedEmbeddingBagCollection must then pool exactly as before (the weights only moved).  Before
# the PR, reshard re-ordered its embedding names but kept the old dims, so with tables of different
# widths each key comes back split at the other table's columns.  Written for dmpcheck from the
# PR's description; CPU and Gloo; it exits 1 when the outputs change.
import sys
import torch
import torch.distributed as dist
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan


def _cpu_placement_shim():
    # Version shim: torchrec 1.2.0 dynamic_sharding.update_state_dict_post_resharding hard-codes the new shard
    # placement "rank:r/cuda:r", which torch rejects for a CPU tensor (ValueError: Local shard tensor device does
    # not match ...). Rewrite the placement to the tensor's real device; a no-op where they already match.
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
    _cpu_placement_shim()
    dist.init_process_group(backend="gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    assert ws == 2, "run with --nproc_per_node 2"
    torch.manual_seed(0)
    tables = [  # different dims on purpose: 4 and 8
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=8, feature_names=["f0"]),
        EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=8, feature_names=["f1"]),
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    sharder = EmbeddingBagCollectionSharder()

    def tw(r0, r1):  # t0 on rank r0, t1 on rank r1 (fused kernel, the usual training kernel)
        return construct_module_sharding_plan(
            ebc, {"t0": table_wise(rank=r0, compute_kernel="fused"), "t1": table_wise(rank=r1, compute_kernel="fused")},
            sharder=sharder, local_size=ws, world_size=ws, device_type="cpu")

    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=ShardingPlan({"": tw(0, 1)}),
                                     sharders=[sharder], init_data_parallel=False)
    print(f"[rank{rank}] torchrec {torchrec.__version__} torch {torch.__version__}", flush=True)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([1, 2, 3, 4, 5, 6, 7]), lengths=torch.tensor([2, 1, 3, 1]))
    before = {k: v.detach().clone() for k, v in model(kjt).wait().to_dict().items()}

    sebc = model.module  # the ShardedEmbeddingBagCollection (DMP wraps the root module)
    if not hasattr(sharder, "reshard"):
        print(f"[rank{rank}] NOT RUNNABLE: EmbeddingBagCollectionSharder has no reshard (API added by PR #2852)", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    sharder.reshard(sebc, tw(1, 0), ShardingEnv.from_process_group(dist.GroupMember.WORLD), torch.device("cpu"))
    after = {k: v.detach() for k, v in model(kjt).wait().to_dict().items()}

    print(f"[rank{rank}] _embedding_names={sebc._embedding_names} _embedding_dims={sebc._embedding_dims} "
          f"plan ranks={ {t: p.ranks for t, p in sebc.module_sharding_plan.items()} }", flush=True)
    bad = []
    for k in ["f0", "f1"]:
        print(f"[rank{rank}] {k}: before shape {tuple(before[k].shape)}, after shape {tuple(after[k].shape)}", flush=True)
        if before[k].shape != after[k].shape or not torch.allclose(before[k], after[k]):
            bad.append(k)
    if bad:
        print(f"[rank{rank}] BUG: pooled embeddings changed by reshard for {bad} (stale output layout)", flush=True)
        sys.exit(1)
    print(f"[rank{rank}] OK: outputs identical before/after reshard", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
