# Hooks of torchrec-2563-cast-after-wrap.yaml: the user's step that the scenario format lacks, a cast of
# the wrapped model (model.bfloat16(), TorchRec #2563), and what the user looked at after it.
import torch


def _collection(model):
    """The sharded EmbeddingCollection inside DistributedModelParallel (and its DDP over the dense part)."""
    inner = model._dmp_wrapped_module
    return getattr(inner, "module", inner).ec


def _lookup_row(model, feature, row):
    """The sharded model's own lookup of one id of a sequence table, as the user reads it back."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    collection = _collection(model)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[feature], values=torch.tensor([row]), lengths=torch.tensor([1]))
    return collection(kjt)[feature].values()[0]


def hook_after_wrap(ctx):
    model = ctx.model
    weight = _collection(model).embeddings["seq"].weight
    with torch.no_grad():
        weight[1].fill_(0.5)
    visible_before = bool(torch.all(_lookup_row(model, "f_seq", 1).float() == 0.5))
    model.bfloat16()  # the user's cast, in place, after the wrap
    weight = _collection(model).embeddings["seq"].weight
    with torch.no_grad():
        weight[1].fill_(0.25)
    looked_up = _lookup_row(model, "f_seq", 1)
    return {
        "weight_is_leaf": weight.is_leaf,
        "write_visible_before_cast": visible_before,
        "weight_dtype_after_cast": str(weight.dtype),
        "lookup_dtype_after_cast": str(looked_up.dtype),
        "write_visible_after_cast": bool(torch.all(looked_up.float() == 0.25)),
    }
