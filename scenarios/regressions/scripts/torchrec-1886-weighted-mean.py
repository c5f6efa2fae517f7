# Repro for meta-pytorch/torchrec PR #1886 ("include kjt weights in mean pooling"): a weighted EmbeddingBagCollection
# Written for dmpcheck from the PR's text (a script cell of scenarios/regressions/torchrec-1886-weighted-mean-pooling.yaml).
# with MEAN pooling, ROW_WISE-sharded under DMP, must return sum(w*e)/sum(w) like the unsharded module.
# All table rows are 1.0, so the correct weighted mean is exactly 1.0 for every bag.
# Run: torchrun --nproc_per_node 2 repro.py (CPU, gloo)
import sys
import torch
import torch.distributed as dist
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingPlan


def ones_init(t):
    with torch.no_grad():
        return t.fill_(1.0)


def main():
    dist.init_process_group(backend="gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=8, feature_names=["f0"],
                                 pooling=PoolingType.MEAN, init_fn=ones_init)]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=torch.tensor([0, 7, 1]), lengths=torch.tensor([2, 1]),
        weights=torch.tensor([2.0, 4.0, 0.5]),
    )
    # (the unsharded EmbeddingBagCollection cannot serve as reference: torch's embedding_bag raises
    #  NotImplementedError for per_sample_weights with mode='mean'; expected value is computed analytically)
    sharder = EmbeddingBagCollectionSharder()
    mod = EmbeddingBagCollection(tables=tables, is_weighted=True, device=torch.device("meta"))
    mplan = construct_module_sharding_plan(mod, per_param_sharding={"t0": row_wise()}, sharder=sharder,
                                           local_size=ws, world_size=ws, device_type="cpu")
    mplan["t0"].compute_kernel = "fused"
    model = DistributedModelParallel(mod, device=torch.device("cpu"), plan=ShardingPlan({"": mplan}), sharders=[sharder])
    out = model(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    got = out["f0"].detach()
    print(f"[rank{rank}] torchrec {getattr(torchrec, '__version__', '(a source tree)')} torch {torch.__version__}", flush=True)
    print(f"[rank{rank}] expected weighted MEAN: bag0 (2*1+4*1)/(2+4)=1.0, bag1 (0.5*1)/0.5=1.0", flush=True)
    print(f"[rank{rank}] RW-sharded weighted MEAN: {got.tolist()}", flush=True)
    ok = torch.allclose(got, torch.ones_like(got), atol=1e-5)
    print(f"[rank{rank}] sharded matches weighted mean (all 1.0): {ok}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(f"[rank{rank}] BUG: sharded weighted MEAN pooling differs from sum(w*e)/sum(w)")


if __name__ == "__main__":
    main()
