# Hooks of scenarios/examples/feature_processed.yaml: the module to wrap is one dmpcheck does not
# build, a FeatureProcessedEmbeddingBagCollection (a position weight per feature and position in
# front of the scenario's EBC).  hook_build_model runs on every rank before the planner, and again
# for the unsharded oracle (ctx.unsharded), so both train the same modules.
import torch


def hook_build_model(ctx):
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

    # Position weights for the first 8 ids of every bag of every feature.
    lengths = {f: 8 for table in ctx.tables.values() for f in table["features"]}
    processors = PositionWeightedModuleCollection(max_feature_lengths=lengths, device=torch.device(ctx.device))
    # Around the scenario's own EBC, which keeps its tables and their in-backward optimizer.
    ctx.model.ebc = FeatureProcessedEmbeddingBagCollection(ctx.model.ebc, processors)
    ctx.sharders.insert(0, FeatureProcessedEmbeddingBagCollectionSharder())
    return {"collection": type(ctx.model.ebc).__name__}


def hook_at_end(ctx):
    return {"position_weights": sum(1 for name, _ in ctx.model.named_parameters() if "position_weights" in name)}
