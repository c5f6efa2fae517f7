"""TorchRec's planner under the scenario's constraints, the sharders, and its plan as the contract's rows."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Set, Tuple

from dmpcheck_torchrec import contract
from dmpcheck_torchrec.models import is_embedding_bag
from dmpcheck_torchrec.optim import Unsupported

if TYPE_CHECKING:
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ModuleSharder, ShardingPlan


def parameter_constraints(spec: contract.RunSpec) -> Dict[str, ParameterConstraints]:
    from torchrec.distributed.planner.types import ParameterConstraints

    fields = {f.name for f in dataclasses.fields(ParameterConstraints)}
    out: Dict[str, ParameterConstraints] = {}
    for t in spec.tables:
        c = t.constraints
        kwargs: Dict[str, Any] = {}
        if c.sharding_types:
            kwargs["sharding_types"] = list(c.sharding_types)
        if c.column_shards:
            if "min_partition" not in fields:
                raise Unsupported("column_shards: this release's ParameterConstraints has no min_partition")
            kwargs["min_partition"] = t.dim // c.column_shards
        if kwargs:
            # The planner keys constraints by the sharded parameter's name: a table's name in an
            # EBC, "weight" for a plain nn.EmbeddingBag.
            out["weight" if is_embedding_bag(spec) else t.name] = ParameterConstraints(**kwargs)
    return out


def make_sharder(spec: contract.RunSpec) -> Tuple[ModuleSharder, List[str]]:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingType

    if any(t.managed_collision.input_hash_size for t in spec.tables if t.pooling != "none"):
        return _managed_collision_sharder(spec, bagged=True)
    if is_embedding_bag(spec):
        # A plain nn.EmbeddingBag has its own sharder; its sharding types are the base class's.
        from torchrec.distributed.embeddingbag import EmbeddingBagSharder

        return EmbeddingBagSharder(), ["the table is a torch.nn.EmbeddingBag, sharded by TorchRec's EmbeddingBagSharder"]
    wanted = {st for t in spec.tables for st in t.constraints.sharding_types}
    extra = [st for st in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value) if st in wanted]
    if not extra or spec.sharder == "stock":
        return EmbeddingBagCollectionSharder(), []

    class CpuRowWiseSharder(EmbeddingBagCollectionSharder):
        # TorchRec's sharder offers row_wise and table_row_wise only for cuda/tpu devices.
        def sharding_types(self, compute_device_type: str) -> List[str]:
            types = list(super().sharding_types(compute_device_type))
            return types + [st for st in extra if st not in types]

    return CpuRowWiseSharder(), [f"the EBC sharder was extended to offer {', '.join(extra)} on cpu"]


def _managed_collision_sharder(spec: contract.RunSpec, bagged: bool) -> Tuple[ModuleSharder, List[str]]:
    """TorchRec's sharder of a managed-collision EBC (`bagged`) or EC, as the scenario asks."""
    if bagged:
        from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder as Stock
    else:
        from torchrec.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder as Stock
    what = "EBC" if bagged else "EC"

    if spec.sharder == "stock":
        return Stock(), []

    class CpuManagedCollisionSharder(Stock):
        # TorchRec's MC-EBC sharder offers no sharding type on cpu (TorchRec #2958): the ones it
        # offers on cuda, as the extended sharder does for row_wise.
        def sharding_types(self, compute_device_type: str) -> List[str]:
            return list(super().sharding_types("cuda"))

        # ... and FBGEMM's fused kernel (the dense one fails at the first eviction, measured).
        def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
            return [k for k in super().compute_kernels(sharding_type, "cuda") if k == "fused"]

    offered = CpuManagedCollisionSharder().sharding_types("cpu")
    return CpuManagedCollisionSharder(), [f"the managed-collision {what} sharder was extended to offer on cpu what it "
                                          f"offers on cuda ({', '.join(offered)}; TorchRec #2958), with the "
                                          f"fused kernel"]


def plan_of(plan: ShardingPlan, table_names: Set[str]) -> List[contract.PlanRow]:
    out: List[contract.PlanRow] = []
    for module_path, module_plan in plan.plan.items():
        for table, ps in module_plan.items():
            if table not in table_names and module_path.split(".")[-1] in table_names:
                table = module_path.split(".")[-1]  # an nn.EmbeddingBag's "weight", by its table
            if table not in table_names:
                continue
            shards: List[contract.ShardRow] = []
            if ps.sharding_spec is not None:
                for s in ps.sharding_spec.shards:
                    rank = int(str(s.placement).split("rank:")[1].split("/")[0])
                    offs = list(s.shard_offsets) + [0]
                    sizes = list(s.shard_sizes) + [0]
                    shards.append(contract.ShardRow(rank=rank, row_offset=offs[0], rows=sizes[0], col_offset=offs[1],
                                                    cols=sizes[1]))
            else:  # a data-parallel replica: the whole table on each rank
                shards = [contract.ShardRow(rank=r, row_offset=0, rows=-1, col_offset=0, cols=-1)
                          for r in (ps.ranks or [])]
            out.append(contract.PlanRow(table=table, sharding=ps.sharding_type, compute_kernel=ps.compute_kernel,
                                        ranks=list(ps.ranks or []), shards=shards))
    return out


def build_planner(spec: contract.RunSpec, world: int,
                  local_world: int) -> Tuple[EmbeddingShardingPlanner, List[ModuleSharder], List[str]]:
    """TorchRec's planner under the scenario's constraints, the sharders, and notes on what was adapted."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    constraints = parameter_constraints(spec)
    sharder, notes = make_sharder(spec)
    sharders = [sharder]
    if any(t.pooling == "none" and t.managed_collision.input_hash_size for t in spec.tables):
        mc_sharder, mc_notes = _managed_collision_sharder(spec, bagged=False)
        sharders.append(mc_sharder)
        notes += mc_notes
    if any(t.pooling == "none" for t in spec.tables):
        from torchrec.distributed.embedding import EmbeddingCollectionSharder

        if not any(t.pooling == "none" and t.managed_collision.input_hash_size for t in spec.tables):
            sharders.append(EmbeddingCollectionSharder())
        notes.append("sequence tables (pooling: none) are in an EmbeddingCollection; the model sums each bag's rows, "
                     "and each id's row is an output of its own (sequence_embeddings.<feature>)")
    # topology.memory_per_rank: what the planner may place on a rank.  On CPU its storage is DDR.
    caps = {"ddr_cap": spec.memory_per_rank} if spec.memory_per_rank else {}
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=local_world, **caps)
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints), sharders, notes
