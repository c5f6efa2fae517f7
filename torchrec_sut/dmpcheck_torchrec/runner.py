"""Builds, shards, trains and dumps the scenario's model on the installed TorchRec release."""

import dataclasses
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from dmpcheck_torchrec import dump


class Unsupported(Exception):
    """The scenario asks for something this rank program cannot express on TorchRec."""


def _version(dist_name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return ""


class Model(nn.Module):
    """EmbeddingBagCollection (and an EmbeddingCollection for sequence tables, each bag's rows
    summed) -> Linear layers (ReLU between) -> mean, as dmpcheck's reference."""

    def __init__(self, tables, layers, features, weighted, device="meta", sequence_tables=()):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingCollection

        # On the meta device, as TorchRec users build large models: DMP materialises the tables
        # and draws each rank's shards itself.  On cpu where the user fills the tables first.
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device), is_weighted=weighted) if tables else None
        self.ec = EmbeddingCollection(tables=list(sequence_tables), device=torch.device(device)) if sequence_tables else None
        self.bag_features = [f for t in tables for f in t.feature_names]
        self.sequence_features = [f for t in sequence_tables for f in t.feature_names]
        width = sum(t.embedding_dim * len(t.feature_names) for t in list(tables) + list(sequence_tables))
        self.dense = nn.ModuleList()
        for out in layers:
            self.dense.append(nn.Linear(width, out))
            width = out
        self.features = features

    def forward(self, kjt):
        if self.ec is None:
            pooled = self.ebc(kjt).to_dict()
        else:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

            bags = kjt.to_dict()
            pooled = {}
            if self.ebc is not None:
                pooled.update(self.ebc(KeyedJaggedTensor.from_jt_dict({f: bags[f] for f in self.bag_features})).to_dict())
            sequences = self.ec(KeyedJaggedTensor.from_jt_dict({f: bags[f] for f in self.sequence_features}))
            for f in self.sequence_features:
                # Each bag's rows summed, in id order, as the model's input.
                rows = sequences[f].values()
                lengths = sequences[f].lengths().long()
                bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
                pooled[f] = torch.zeros(lengths.numel(), rows.shape[1], dtype=rows.dtype).index_add_(0, bag, rows)
        # By key, in the model's feature order: a sharded EBC may return its keys in sharding order.
        x = torch.cat([pooled[f] for f in self.features], dim=1)
        for i, layer in enumerate(self.dense):
            x = layer(x)
            if i + 1 < len(self.dense):
                x = torch.relu(x)
        # What the forward produced, for output comparisons: this rank's rows of every feature's
        # pooled embedding and of the model's output (kept here, not returned: DMP's wrapper
        # hands back the loss as the user's model does).
        LAST_OUTPUTS.clear()
        LAST_OUTPUTS.update({"pooled_embeddings." + f: pooled[f].detach().clone() for f in self.features})
        LAST_OUTPUTS["model_output"] = x.detach().clone()
        return x.mean()


class BagModel(nn.Module):
    """One torch.nn.EmbeddingBag -> Linear layers (ReLU between) -> mean: the model of TorchRec #602.

    The bag sits where an EBC keeps its tables (ebc.embedding_bags.<table>), so its state_dict keys
    are the EBC's and every comparison reads it alike."""

    def __init__(self, table, layers, device="meta"):
        super().__init__()
        self.ebc = nn.Module()
        self.ebc.embedding_bags = nn.ModuleDict(
            {table["name"]: nn.EmbeddingBag(table["rows"], table["dim"], mode=table["pooling"], device=torch.device(device))})
        self.table = table["name"]
        self.feature = table["features"][0]
        self.dense = nn.ModuleList()
        width = table["dim"]
        for out in layers:
            self.dense.append(nn.Linear(width, out))
            width = out

    def forward(self, kjt):
        bags = kjt[self.feature]
        # nn.EmbeddingBag's offsets: where each bag starts (the KJT's offsets without the last).
        pooled = self.ebc.embedding_bags[self.table](bags.values(), bags.offsets()[:-1])
        x = pooled
        for i, layer in enumerate(self.dense):
            x = layer(x)
            if i + 1 < len(self.dense):
                x = torch.relu(x)
        LAST_OUTPUTS.clear()
        LAST_OUTPUTS["pooled_embeddings." + self.feature] = pooled.detach().clone()
        LAST_OUTPUTS["model_output"] = x.detach().clone()
        return x.mean()


def _embedding_bag(spec):
    return spec.get("module") == "embedding_bag"


LAST_OUTPUTS = {}


def _output_pieces(rank, world, batch_size):
    """This rank's rows of the last forward's outputs, placed in the global batch (rank order)."""
    pieces = []
    for name, t in sorted(LAST_OUTPUTS.items()):
        t = t.reshape(t.shape[0], -1)
        pieces.append({"name": name, "sharding": "output", "replicated": False,
                       "full_sizes": [batch_size * world, t.shape[1]], "row_offset": rank * batch_size,
                       "col_offset": 0, "tensor": t})
    return pieces


def _sparse_optimizer(cfg):
    kind = cfg["type"]
    kwargs = {"lr": cfg["lr"]}
    if kind == "sgd":
        return torch.optim.SGD, kwargs
    if kind == "adagrad":
        kwargs["eps"] = cfg["eps"]
        return torch.optim.Adagrad, kwargs
    if kind == "rowwise_adagrad":
        from torchrec.optim import RowWiseAdagrad

        kwargs["eps"] = cfg["eps"]
        if cfg.get("weight_decay", 0.0):
            kwargs["weight_decay"] = cfg["weight_decay"]
        return RowWiseAdagrad, kwargs
    if kind == "adam":
        # torch.optim.Adam would be built with these kwargs and takes no beta1/beta2, while
        # FBGEMM's fused Adam takes no `betas` (TypeError from SplitTableBatchedEmbeddingBags-
        # Codegen, measured on 1.9.2): TorchRec's own Adam class (optimizers.Adam) hands them to FBGEMM as given.
        from torchrec.optim import optimizers

        kwargs["eps"] = cfg["eps"]
        kwargs["beta1"] = cfg["beta1"]
        kwargs["beta2"] = cfg["beta2"]
        return optimizers.Adam, kwargs
    raise Unsupported(f"sparse optimizer '{kind}'")


def _dense_optimizer_factory(cfg):
    kind = cfg["type"]
    if kind == "sgd":
        return lambda params: torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0.0),
                                              weight_decay=cfg.get("weight_decay", 0.0))
    if kind == "adagrad":
        return lambda params: torch.optim.Adagrad(params, lr=cfg["lr"], eps=cfg["eps"],
                                                  weight_decay=cfg.get("weight_decay", 0.0))
    if kind == "adam":
        return lambda params: torch.optim.Adam(params, lr=cfg["lr"], eps=cfg["eps"],
                                               betas=(cfg["beta1"], cfg["beta2"]),
                                               weight_decay=cfg.get("weight_decay", 0.0))
    raise Unsupported(f"dense optimizer '{kind}'")


def _constraints(spec):
    from torchrec.distributed.planner.types import ParameterConstraints

    fields = {f.name for f in dataclasses.fields(ParameterConstraints)}
    out = {}
    notes = []
    for t in spec["tables"]:
        c = t.get("constraints", {})
        kwargs = {}
        if c.get("sharding_types"):
            kwargs["sharding_types"] = list(c["sharding_types"])
        if c.get("column_shards"):
            if "min_partition" not in fields:
                raise Unsupported("column_shards: this release's ParameterConstraints has no min_partition")
            kwargs["min_partition"] = t["dim"] // c["column_shards"]
        if c.get("ranks"):
            notes.append(f"{t['name']}: 'ranks' has no TorchRec ParameterConstraints field; the planner chose freely")
        if kwargs:
            # The planner keys constraints by the sharded parameter's name: a table's name in an
            # EBC, "weight" for a plain nn.EmbeddingBag.
            out["weight" if _embedding_bag(spec) else t["name"]] = ParameterConstraints(**kwargs)
    return out, notes


def _sharder(spec):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingType

    if _embedding_bag(spec):
        # A plain nn.EmbeddingBag has its own sharder; its sharding types are the base class's.
        from torchrec.distributed.embeddingbag import EmbeddingBagSharder

        return EmbeddingBagSharder(), ["the table is a torch.nn.EmbeddingBag, sharded by TorchRec's EmbeddingBagSharder"]
    wanted = {st for t in spec["tables"] for st in t.get("constraints", {}).get("sharding_types", [])}
    extra = [st for st in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value) if st in wanted]
    if not extra or spec.get("sharder") == "stock":
        return EmbeddingBagCollectionSharder(), []

    class CpuRowWiseSharder(EmbeddingBagCollectionSharder):
        # TorchRec's sharder offers row_wise and table_row_wise only for cuda/tpu devices.
        def sharding_types(self, compute_device_type):
            types = list(super().sharding_types(compute_device_type))
            return types + [st for st in extra if st not in types]

    return CpuRowWiseSharder(), [f"the EBC sharder was extended to offer {', '.join(extra)} on cpu"]


def _plan_of(plan, table_names):
    out = []
    for module_path, module_plan in plan.plan.items():
        for table, ps in module_plan.items():
            if table not in table_names and module_path.split(".")[-1] in table_names:
                table = module_path.split(".")[-1]  # an nn.EmbeddingBag's "weight", by its table
            if table not in table_names:
                continue
            shards = []
            if ps.sharding_spec is not None:
                for s in ps.sharding_spec.shards:
                    rank = int(str(s.placement).split("rank:")[1].split("/")[0])
                    offs = list(s.shard_offsets) + [0]
                    sizes = list(s.shard_sizes) + [0]
                    shards.append({"rank": rank, "row_offset": offs[0], "rows": sizes[0],
                                   "col_offset": offs[1], "cols": sizes[1]})
            else:
                shards = [{"rank": r, "row_offset": 0, "rows": -1, "col_offset": 0, "cols": -1} for r in (ps.ranks or [])]
            out.append({"table": table, "sharding": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                        "ranks": list(ps.ranks or []), "shards": shards})
    return out


def _load_batch(exchange, step, rank):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    with open(os.path.join(exchange, "batches", f"step{step}_rank{rank}.json")) as f:
        b = json.load(f)
    weights = None if b.get("weights") is None else torch.tensor(b["weights"], dtype=torch.float32)
    return KeyedJaggedTensor(keys=b["keys"], values=torch.tensor(b["values"], dtype=torch.int64),
                             lengths=torch.tensor(b["lengths"], dtype=torch.int32), weights=weights)


def _table_of(key, tables):
    parts = key.split(".")
    for name in tables:
        if name in parts:
            return name
    return None


def _dmpcheck_name(key):
    """dmpcheck names every table's tensors as an EBC's (ebc.embedding_bags.<table>.*), sequence
    tables in the EmbeddingCollection (ec.embeddings.<table>.*) too."""
    return "ebc.embedding_bags." + key[len("ec.embeddings."):] if key.startswith("ec.embeddings.") else key


def _state_pieces(model, dense_opt, types, table_dims):
    """Every tensor this rank holds, under dmpcheck's names, with where it sits in the full tensor."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    pieces = []

    def add_sharded(name, sharding, st, table):
        full = list(st.size())
        for sh in st.local_shards():
            offs = list(sh.metadata.shard_offsets)
            t = sh.tensor
            row_off = offs[0]
            col_off = offs[1] if len(offs) > 1 else 0
            # (A row-wise optimizer state of a column-sharded table is [shards * rows] here and in
            # dmpcheck alike: column shard k's block at k * rows.)
            pieces.append({"name": name, "sharding": sharding, "replicated": False, "full_sizes": full,
                           "row_offset": row_off, "col_offset": col_off, "tensor": t})

    for key, v in model.state_dict().items():
        table = _table_of(key, types)
        if isinstance(v, ShardedTensor):
            add_sharded(_dmpcheck_name(key), types[table], v, table)
        elif torch.is_floating_point(v):
            sharding = types[table] if table else "dense"
            pieces.append({"name": _dmpcheck_name(key), "sharding": sharding, "replicated": True, "full_sizes": list(v.shape),
                           "tensor": v})
    # The fused (in-backward) optimizer of the model-parallel tables.
    for key, states in model.fused_optimizer.state_dict()["state"].items():
        table = _table_of(key, types)
        for sname, v in states.items():
            short = sname.split(".")[-1]
            name = f"ebc.embedding_bags.{table}.{short}"
            if isinstance(v, ShardedTensor):
                add_sharded(name, types[table], v, table)
    # Whatever optimizer covers the rest (dense layers, and data-parallel tables in TorchRec).
    for key, states in dense_opt.state_dict()["state"].items():
        table = _table_of(key, types)
        for sname, v in states.items():
            if not isinstance(v, torch.Tensor) or not torch.is_floating_point(v) or v.dim() == 0:
                continue  # step counters
            pieces.append({"name": f"{_dmpcheck_name(key)}.{sname}", "sharding": types[table] if table else "dense",
                           "replicated": True, "full_sizes": list(v.shape), "tensor": v})
    return pieces


def _local_tensors(model):
    """This rank's tensors of the model's state_dict, local shards included, by key."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for key, v in model.state_dict().items():
        if isinstance(v, ShardedTensor):
            for i, sh in enumerate(v.local_shards()):
                out[f"{key}#{i}"] = sh.tensor
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


def _load_initial(model, path):
    """Overwrites the live weights with whole tensors from dmpcheck (the reference's initial state)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    full = dump.read_full(path)
    loaded = []
    with torch.no_grad():
        params = dict(model.named_parameters())
        for key, v in model.state_dict().items():
            if _dmpcheck_name(key) not in full:
                continue
            src = full[_dmpcheck_name(key)]
            if isinstance(v, ShardedTensor):
                for sh in v.local_shards():
                    offs = list(sh.metadata.shard_offsets)
                    sizes = list(sh.metadata.shard_sizes)
                    block = src[offs[0]: offs[0] + sizes[0]]
                    if len(offs) > 1:
                        block = block[:, offs[1]: offs[1] + sizes[1]]
                    sh.tensor.copy_(block)
            elif key in params:
                params[key].copy_(src)
            else:
                v.copy_(src)
            loaded.append(key)
    return loaded


def build_model(spec, device="meta"):
    """The scenario's model as a TorchRec user writes it, with the sparse optimizer applied in backward."""
    from torchrec import EmbeddingBagConfig, PoolingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    if _embedding_bag(spec):
        t = spec["tables"][0]
        if t["weighted"] or t.get("data_type", "fp32") != "fp32":
            raise Unsupported("module embedding_bag: an unweighted fp32 table (what TorchRec #602's model has)")
        model = BagModel(t, spec["dense_layers"], device)
        opt_cls, opt_kwargs = _sparse_optimizer(spec["sparse_optimizer"])
        apply_optimizer_in_backward(opt_cls, model.ebc.parameters(), dict(opt_kwargs))
        return model
    weighted = [t["weighted"] for t in spec["tables"] if t["pooling"] != "none"]
    if any(weighted) and not all(weighted):
        raise Unsupported("weighted and unweighted tables in one EmbeddingBagCollection (TorchRec needs two)")
    from torchrec import DataType

    pooling = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    data_type = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
    from torchrec import EmbeddingConfig

    tables = [EmbeddingBagConfig(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                 feature_names=list(t["features"]), pooling=pooling[t["pooling"]],
                                 data_type=data_type[t.get("data_type", "fp32")])
              for t in spec["tables"] if t["pooling"] != "none"]
    # Sequence tables (pooling: none) go into an EmbeddingCollection.
    sequence_tables = [EmbeddingConfig(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                       feature_names=list(t["features"]), data_type=data_type[t.get("data_type", "fp32")])
                       for t in spec["tables"] if t["pooling"] == "none"]
    # The EBC's output keys: a feature several tables read is "<feature>@<table>" (TorchRec's naming).
    readers = {}
    for t in spec["tables"]:
        for f in t["features"]:
            readers[f] = readers.get(f, 0) + 1
    features = [f if readers[f] == 1 else f"{f}@{t['name']}" for t in spec["tables"] for f in t["features"]]
    model = Model(tables, spec["dense_layers"], features, all(weighted) and bool(weighted), device, sequence_tables)
    opt_cls, opt_kwargs = _sparse_optimizer(spec["sparse_optimizer"])
    for module in (model.ebc, model.ec):
        if module is not None:
            apply_optimizer_in_backward(opt_cls, module.parameters(), dict(opt_kwargs))
    return model


def build_planner(spec, world, local_world):
    """TorchRec's planner under the scenario's constraints, the sharders, and notes on what was adapted."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    constraints, notes = _constraints(spec)
    sharder, sharder_notes = _sharder(spec)
    sharders = [sharder]
    if any(t["pooling"] == "none" for t in spec["tables"]):
        from torchrec.distributed.embedding import EmbeddingCollectionSharder

        sharders.append(EmbeddingCollectionSharder())
        sharder_notes.append("sequence tables (pooling: none) are in an EmbeddingCollection; the model sums each bag's rows")
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=local_world)
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints), sharders, notes + sharder_notes


def run(spec, exchange, out_dir, rank, import_s):
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    t0 = time.perf_counter()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=float(spec["timeout_s"])))
    world = dist.get_world_size()
    if world != spec["world_size"]:
        raise Unsupported(f"the scenario needs {spec['world_size']} ranks, WORLD_SIZE is {world}")
    device = torch.device("cpu")

    # The init mode as a TorchRec user applies it: one torch.manual_seed before the model exists,
    # the same on every rank (seeded) or a different one per rank (unseeded).
    init = spec["init"]
    torch.manual_seed(int(init["seed"]) + (rank if init["mode"] == "unseeded" else 0))

    before_wrap = bool(init.get("from_state")) and init.get("load") == "before_wrap"
    model = build_model(spec, "cpu" if before_wrap else "meta")
    if before_wrap:
        # The user's weights put into the unsharded model, which is then wrapped (TorchRec #1165).
        own = {_dmpcheck_name(k): k for k in model.state_dict()}
        full = {own.get(k, k): v for k, v in dump.read_full(init["from_state"]).items()}
        missing = [k for k in full if k not in model.state_dict()]
        if missing:
            raise Unsupported(f"init.from holds {', '.join(missing)}, which the model does not")
        with torch.no_grad():
            model.load_state_dict(full, strict=False)
    planner, sharders, notes = build_planner(spec, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    plan_rows = _plan_of(plan, {t["name"] for t in spec["tables"]})
    types = {p["table"]: p["sharding"] for p in plan_rows}
    table_dims = {t["name"]: (t["rows"], t["dim"]) for t in spec["tables"]}

    sharded = DistributedModelParallel(model, plan=plan, sharders=sharders, device=device)
    if before_wrap:
        notes.append(f"init.from's weights were loaded into the unsharded model before the wrap ({len(full)} tensors)")
    elif init.get("from_state"):
        loaded = _load_initial(sharded, init["from_state"])
        if init["from_state"].endswith("user_weights.json"):
            notes.append(f"init.from's weights were loaded into the sharded model after the wrap ({len(loaded)} tensors)")
        else:
            notes.append(f"started from the reference's initial weights ({len(loaded)} tensors)")
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(sharded.named_parameters())),
                                      _dense_optimizer_factory(spec["dense_optimizer"]))
    optimizer = CombinedOptimizer([sharded.fused_optimizer, dense_opt])
    init_s = time.perf_counter() - t0

    dump.write_phase(out_dir, rank, "init", _state_pieces(sharded, dense_opt, types, table_dims))
    losses = []
    t1 = time.perf_counter()
    outputs = bool(spec.get("outputs"))
    if outputs and int(spec["steps"]) == 0:  # the forward alone: the outputs at step 0
        with torch.no_grad():
            sharded(_load_batch(exchange, 1, rank))
        dump.write_phase(out_dir, rank, "outputs0", _output_pieces(rank, world, int(spec["batch_size"])))
    for step in range(1, int(spec["steps"]) + 1):
        loss = sharded(_load_batch(exchange, step, rank))
        if outputs:  # the forward of step s runs on the weights after s - 1 steps
            dump.write_phase(out_dir, rank, f"outputs{step - 1}", _output_pieces(rank, world, int(spec["batch_size"])))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.item()))
        dump.write_phase(out_dir, rank, f"step{step}", _state_pieces(sharded, dense_opt, types, table_dims))
        print(f"step {step}/{spec['steps']} loss {losses[-1]:.6f}", flush=True)
    train_s = time.perf_counter() - t1
    for t in spec["tables"]:
        if t.get("data_type", "fp32") != "fp32" and LAST_OUTPUTS:
            held = {str(v.dtype) for k, v in _local_tensors(sharded).items() if f".{t['name']}." in k}
            returned = {str(v.dtype) for k, v in LAST_OUTPUTS.items()
                        if k.startswith("pooled_embeddings.") and k.split(".", 1)[1].split("@")[0] in t["features"]}
            notes.append(f"table {t['name']} ({t['data_type']}): weights held as {', '.join(sorted(held))}; "
                         f"pooled embeddings returned as {', '.join(sorted(returned))}")
    dist.barrier()
    if rank == 0:
        meta = {"versions": {"torchrec": _version("torchrec"), "torch": torch.__version__,
                             "fbgemm_gpu": _version("fbgemm-gpu-cpu") or _version("fbgemm-gpu")},
                "plan": plan_rows, "losses": losses, "notes": notes,
                "timings": {"import_s": import_s, "init_s": init_s, "train_s": train_s}}
        tmp = os.path.join(out_dir, "meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, os.path.join(out_dir, "meta.json"))
    dist.destroy_process_group()
