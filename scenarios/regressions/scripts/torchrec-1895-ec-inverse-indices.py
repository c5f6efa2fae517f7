# Repro for meta-pytorch/torchrec#1895: unsharded EmbeddingCollection ignores KJT inverse_indices (variable batch / VBE).
# A script cell of scenarios/regressions/torchrec-1895-ec-ignores-inverse-indices.yaml.
# Single process, CPU. Adapted (shortened) from the reporter's snippet.
import sys
import torch
import torchrec
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                      EmbeddingConfig, KeyedJaggedTensor)

torch.manual_seed(0)
print(f"torchrec {getattr(torchrec, '__version__', '(a source tree)')} torch {torch.__version__}")
# full batch of 3: t1 = [0],[0],[0]; t2 = [0],[],[2]
kt_full = KeyedJaggedTensor(
    keys=["t1", "t2"], values=torch.tensor([0, 0, 0, 0, 2]),
    lengths=torch.tensor([1, 1, 1, 1, 0, 1], dtype=torch.int64),
)
# same batch, deduplicated VBE form: t1 has stride 1 (one unique row), t2 stride 3; inverse_indices expand back to 3
kt_vbe = KeyedJaggedTensor(
    keys=["t1", "t2"], values=torch.tensor([0, 0, 2]),
    lengths=torch.tensor([1, 1, 0, 1], dtype=torch.int64),
    stride_per_key_per_rank=[[1], [3]],
    inverse_indices=(["t1", "t2"], torch.tensor([[0, 0, 0], [0, 1, 2]])),
)
ebc = EmbeddingBagCollection([
    EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="e1", feature_names=["t1"]),
    EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="e2", feature_names=["t2"]),
])
ec = EmbeddingCollection([
    EmbeddingConfig(num_embeddings=10, embedding_dim=4, name="e1", feature_names=["t1"]),
    EmbeddingConfig(num_embeddings=10, embedding_dim=4, name="e2", feature_names=["t2"]),
])
ebc_full, ebc_vbe = ebc(kt_full)["t1"], ebc(kt_vbe)["t1"]
print(f"EBC t1 rows: full={tuple(ebc_full.shape)} vbe={tuple(ebc_vbe.shape)} equal={ebc_full.shape == ebc_vbe.shape and torch.allclose(ebc_full, ebc_vbe)}")
ec_full, ec_vbe = ec(kt_full)["t1"], ec(kt_vbe)["t1"]
n_full, n_vbe = ec_full.lengths().numel(), ec_vbe.lengths().numel()
print(f"EC t1 batch size (lengths numel): full={n_full} vbe={n_vbe}")
if n_full != n_vbe:
    sys.exit("BUG: EmbeddingCollection ignored inverse_indices (VBE output not expanded to full batch)")
print("EC honours inverse_indices")
