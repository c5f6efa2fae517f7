# Hooks of torchrec-2209-fused-ebc-data-parallel.yaml: the module to wrap is a
# FusedEmbeddingBagCollection (its optimizer fused into the lookup's backward) over the scenario's
# tables, sharded by TorchRec's FusedEmbeddingBagCollectionSharder.
import torch


def _ddp_without_cpu_device_ids():
    """The one CPU edit the report needs: TorchRec's sharded FusedEBC hands DistributedDataParallel
    device_ids=[its device], which DDP refuses for a CPU module ("device_ids ... only work with
    single-device/multiple-device GPU modules"); on cuda it is what the reporter ran.  Only a CPU
    device list is dropped, so the path past it is the reporter's."""
    import torchrec.distributed.fused_embeddingbag as fused

    ddp = fused.DistributedDataParallel
    if getattr(ddp, "dmpcheck_cpu_edit", False):
        return

    def cpu_ddp(*args, device_ids=None, **kwargs):
        if device_ids and all(getattr(d, "type", None) == "cpu" for d in device_ids):
            device_ids = None
        return ddp(*args, device_ids=device_ids, **kwargs)

    cpu_ddp.dmpcheck_cpu_edit = True
    fused.DistributedDataParallel = cpu_ddp


def hook_build_model(ctx):
    from torchrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    _ddp_without_cpu_device_ids()
    # On cpu whatever ctx.device is: FBGEMM's fused kernels are made with their weights.
    ctx.model.ebc = FusedEmbeddingBagCollection(tables=ctx.model.ebc.embedding_bag_configs(),
                                                optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1},
                                                device=torch.device("cpu"))
    ctx.sharders.insert(0, FusedEmbeddingBagCollectionSharder())


def hook_after_wrap(ctx):
    # What the report's traceback comes from, printed (the run fails before values are compared):
    # the data-parallel lookup inside two DistributedDataParallel wrappers.
    inner = ctx.model._dmp_wrapped_module
    inner = getattr(inner, "module", inner)  # the dense part's own DDP
    lookup, chain = inner.ebc._lookups[0], []
    while type(lookup).__name__ == "DistributedDataParallel":
        chain.append(type(lookup).__name__)
        lookup = lookup.module
    print("the data-parallel lookup: %s" % " > ".join(chain + [type(lookup).__name__]), flush=True)
