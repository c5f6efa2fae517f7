# Hooks of torchrec-3281-position-weights-row-wise.yaml: the module to wrap is a
# FeatureProcessedEmbeddingBagCollection (a position weight per feature and position in the bag in
# front of the scenario's EBC), sharded row_wise as a user asks for it.
import torch


def hook_build_model(ctx):
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingType
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

    class RowWiseOffered(FeatureProcessedEmbeddingBagCollectionSharder):
        """The sharder, offering row_wise where it does not (0.6.0 to 0.8.0 took it out, PR #825):
        what a user who needs row-wise tables writes."""

        def sharding_types(self, compute_device_type):
            types = list(super().sharding_types(compute_device_type))
            row_wise = ShardingType.ROW_WISE.value
            return types if row_wise in types else types + [row_wise]

    lengths = {f: 8 for table in ctx.tables.values() for f in table["features"]}
    processors = PositionWeightedModuleCollection(max_feature_lengths=lengths, device=torch.device(ctx.device))
    ctx.model.ebc = FeatureProcessedEmbeddingBagCollection(ctx.model.ebc, processors)
    ctx.sharders.insert(0, RowWiseOffered())
    offered = RowWiseOffered.__mro__[1]().sharding_types("cpu")
    return {"row_wise_offered_by_torchrec": ShardingType.ROW_WISE.value in offered}


def hook_after_wrap(ctx):
    # TorchRec starts every position weight at 1.0, where positions do not matter: 1, 10, 100, ...
    # per position (the same on every rank; the oracle starts from these too, the sharded model's
    # initial state).
    with torch.no_grad():
        for name, p in ctx.model.named_parameters():
            if "position_weights" in name:
                p.copy_(10.0 ** torch.arange(p.numel(), dtype=p.dtype).clamp(max=3))
