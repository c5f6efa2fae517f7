"""The scenario's optimizers as each release's own classes: the sparse one applied in backward
(FBGEMM's fused kernels for model-parallel tables), the dense one over what is left."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import torch

if TYPE_CHECKING:
    from torchrec.optim.keyed import KeyedOptimizer

    from dmpcheck_torchrec import contract


class Unsupported(Exception):
    """The scenario asks for something this rank program cannot express on this TorchRec."""


# The contract's weight decay modes as FBGEMM's WeightDecayMode members.
_FBGEMM_WEIGHT_DECAY_MODES = {"l2": "L2", "decoupled": "DECOUPLE"}


def _weight_decay_mode_enum() -> Any:
    """FBGEMM's WeightDecayMode class, from wherever this release keeps it; None if it has none."""
    for module in ("fbgemm_gpu.split_table_batched_embeddings_ops_training", "fbgemm_gpu.split_embedding_configs"):
        try:
            return getattr(__import__(module, fromlist=["WeightDecayMode"]), "WeightDecayMode")
        except (ImportError, AttributeError):
            continue
    return None


def _weight_decay_mode(name: str) -> Any:
    """FBGEMM's WeightDecayMode member for `name` (l2, decoupled)."""
    member = _FBGEMM_WEIGHT_DECAY_MODES[name]
    mode = _weight_decay_mode_enum()
    if mode is None:
        raise Unsupported(f"weight_decay_mode {name}: this release's FBGEMM has no WeightDecayMode")
    if not hasattr(mode, member):
        raise Unsupported(f"weight_decay_mode {name}: this release's FBGEMM WeightDecayMode has no {member} "
                          f"(it has {', '.join(m.name for m in mode)})")
    return getattr(mode, member)


def _all_modules(module: torch.nn.Module, seen: Optional[Set[int]] = None) -> Iterator[torch.nn.Module]:
    """Every module under `module`, those a sharded module keeps in plain lists (1.9's _lookups) too."""
    seen = set() if seen is None else seen
    for m in module.modules():
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        for value in vars(m).values():
            for item in value if isinstance(value, list) else ():
                if isinstance(item, torch.nn.Module):
                    yield from _all_modules(item, seen)


def fused_weight_decay_modes(model: torch.nn.Module) -> List[str]:
    """The weight decay modes FBGEMM's fused kernels of `model` hold, by name: what reached them."""
    modes: Set[str] = set()
    for m in _all_modules(model):
        if hasattr(m, "weight_decay_mode") and hasattr(m, "optimizer"):
            mode = m.weight_decay_mode
            if not hasattr(mode, "name"):  # held as its value (1.9)
                mode = _weight_decay_mode_enum()(mode)
            modes.add(mode.name)
    return sorted(modes)


def sparse_optimizer(cfg: contract.SparseOptimizer) -> Tuple[Any, Dict[str, Any]]:
    kind = cfg.type
    kwargs: Dict[str, Any] = {"lr": cfg.lr}
    if kind == "sgd":
        return torch.optim.SGD, kwargs
    kwargs["eps"] = cfg.eps  # every other one's
    if kind == "adagrad":
        return torch.optim.Adagrad, kwargs
    if kind == "rowwise_adagrad":
        from torchrec.optim import RowWiseAdagrad

        if cfg.weight_decay:
            kwargs["weight_decay"] = cfg.weight_decay
        if cfg.weight_decay_mode != "none":
            # Handed through TorchRec's fused params to FBGEMM's kernel, as FBGEMM's own enum.
            kwargs["weight_decay_mode"] = _weight_decay_mode(cfg.weight_decay_mode)
        return RowWiseAdagrad, kwargs
    if kind == "adam":
        # torch.optim.Adam would be built with these kwargs and takes no beta1/beta2, while
        # FBGEMM's fused Adam takes no `betas` (TypeError from SplitTableBatchedEmbeddingBags-
        # Codegen, measured on 1.9.2): TorchRec's own Adam class (optimizers.Adam) hands them to FBGEMM as given.
        from torchrec.optim import optimizers

        kwargs.update(beta1=cfg.beta1, beta2=cfg.beta2)
        return optimizers.Adam, kwargs
    raise Unsupported(f"sparse optimizer '{kind}'")


def in_backward_optimizer_filter(named_parameters: Iterable[Tuple[str, torch.nn.Parameter]]
                                  ) -> Iterator[Tuple[str, torch.nn.Parameter]]:
    """The parameters no optimizer in backward trains: TorchRec's own filter where the release has
    it (0.4.0 on); before, the same rule (torch marks such a parameter `_in_backward_optimizers`)."""
    try:
        from torchrec.optim.optimizers import in_backward_optimizer_filter as torchrecs
    except ImportError:
        return ((name, p) for name, p in named_parameters if not hasattr(p, "_in_backward_optimizers"))
    return iter(torchrecs(named_parameters))


def dense_optimizer(named_parameters: Iterable[Tuple[str, torch.nn.Parameter]],
                    cfg: contract.DenseOptimizer) -> KeyedOptimizer:
    """The dense side's KeyedOptimizer over `named_parameters` (what the in-backward optimizer does
    not train), as a TorchRec user builds it: a KeyedOptimizerWrapper.  rowwise_adagrad is
    torchrec.optim.RowWiseAdagrad, which takes 2-D parameters only (one accumulator per row), so
    the 1-D ones (biases) get torch.optim.Adagrad in a second wrapper, the two combined."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    params = dict(named_parameters)
    if cfg.type != "rowwise_adagrad":
        return KeyedOptimizerWrapper(params, dense_optimizer_factory(cfg))
    from torchrec.optim import RowWiseAdagrad

    rows = {k: p for k, p in params.items() if p.dim() == 2}
    rest = {k: p for k, p in params.items() if p.dim() != 2}
    parts = [KeyedOptimizerWrapper(rows, lambda ps: RowWiseAdagrad(ps, lr=cfg.lr, eps=cfg.eps,
                                                                   weight_decay=cfg.weight_decay))]
    if rest:
        parts.append(KeyedOptimizerWrapper(rest, lambda ps: torch.optim.Adagrad(ps, lr=cfg.lr, eps=cfg.eps,
                                                                                weight_decay=cfg.weight_decay)))
    return CombinedOptimizer(parts)


def dense_optimizer_factory(cfg: contract.DenseOptimizer) -> Callable[[Any], torch.optim.Optimizer]:
    # Per type: the class, and its settings beside lr and weight_decay.
    settings: Dict[str, Tuple[Any, Dict[str, Any]]] = {
        "sgd": (torch.optim.SGD, {"momentum": cfg.momentum}), "adagrad": (torch.optim.Adagrad, {"eps": cfg.eps}),
        "adam": (torch.optim.Adam, {"eps": cfg.eps, "betas": (cfg.beta1, cfg.beta2)})}
    if cfg.type not in settings:
        raise Unsupported(f"dense optimizer '{cfg.type}'")
    cls, extra = settings[cfg.type]
    return lambda params: cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **extra)
