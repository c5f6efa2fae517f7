"""The training loop as users run it: plain (forward, backward, step per batch) or TorchRec's
TrainPipelineSparseDist (progress() over a data iterator until StopIteration)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional, Union

import torch

from dmpcheck_torchrec import dump
from dmpcheck_torchrec.optim import Unsupported

if TYPE_CHECKING:
    from torch import nn
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.optim.keyed import KeyedOptimizer
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class DataIterator:
    """One epoch's batches as a data loader's iterator hands them out, counting every next() asked
    of it after it said it was exhausted (a torch DataLoader's iterator may hang there, #1778)."""

    def __init__(self, load: Callable[[int], KeyedJaggedTensor], steps: Iterable[int], as_batch: bool) -> None:
        """`load`: the rank's batch of a step (dmpcheck's, or what hook_batch made of it)."""
        self._load, self._steps, self._as_batch = load, iter(steps), as_batch
        self._exhausted = False
        self.after_exhausted = 0

    def rearm(self, steps: Iterable[int]) -> DataIterator:
        """This same object made to hand out `steps` next, as a DataLoader with persistent_workers
        hands back its one iterator, reset, from every iter(loader)."""
        self._steps, self._exhausted = iter(steps), False
        return self

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> Union[KeyedJaggedTensor, Batch]:
        if self._exhausted:
            self.after_exhausted += 1
            raise StopIteration
        try:
            step = next(self._steps)
        except StopIteration:
            self._exhausted = True
            raise
        kjt = self._load(step)
        if not self._as_batch:
            return kjt
        # What TorchRec's pipelines take: its Batch (a Pipelineable), the model's input at sparse_features.
        from torchrec.datasets.utils import Batch

        bags = dump.bags_of(kjt)
        return Batch(dense_features=torch.zeros(bags, 0), sparse_features=kjt, labels=torch.zeros(bags))


def pipeline(kind: str, model: nn.Module, optimizer: KeyedOptimizer) -> Optional[TrainPipelineSparseDist]:
    """The release's pipeline for `kind` over the sharded model, None for the plain loop."""
    if kind == "plain":
        return None
    if kind != "train_pipeline_sparse_dist":
        raise Unsupported(f"loop '{kind}'")
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    # The pipeline feeds the model a Batch and expects (losses, output) back.
    model.module.pipelined = True
    return TrainPipelineSparseDist(model, optimizer, torch.device("cpu"), execute_all_batches=True)


def evaluate(pipeline: Optional[TrainPipelineSparseDist], model: nn.Module, data: DataIterator) -> int:
    """One eval pass over `data`, as users run one between epochs: the model in eval mode, the same
    loop under no_grad (the pipeline's progress(), which skips backward and the optimizer step when
    the model is not training; the plain loop's forward) until StopIteration, then training mode
    again.  Returns the batches it executed."""
    model.eval()
    done = 0
    try:
        while True:
            try:
                with torch.no_grad():  # as an eval loop is written (TorchRec #2670's among them)
                    if pipeline is not None:
                        pipeline.progress(data)
                    else:
                        model(next(data))
            except StopIteration:
                return done
            done += 1
    finally:
        model.train()


def train_one(pipeline: Optional[TrainPipelineSparseDist], model: nn.Module, optimizer: KeyedOptimizer,
              data: DataIterator) -> float:
    """One batch trained from `data`; its loss.  StopIteration when the loop ends."""
    if pipeline is not None:
        return float(pipeline.progress(data))
    loss = model(next(data))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.item())
