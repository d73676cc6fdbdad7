"""DeepSeek V4 model numbers that kernels bake in, embedded or read from a HF config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass, asdict
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_nextn_predict_layers: int
    num_attention_heads: int
    head_dim: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    hc_post_mult: float = 2.0
    # Attention / indexer numbers (optional in a config.json; defaults are V4-Flash's).
    qk_rope_head_dim: int = 64
    sliding_window: int = 128
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    # Per layer (+ MTP) KV compression ratio: 0 = SWA only, 4 = indexer-selected, 128 = every block.
    compress_ratios: tuple = ()
    # Linear / FFN shapes (optional; V4-Flash defaults): q LoRA rank, grouped output projection, shared expert.
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    moe_intermediate_size: int = 2048
    n_shared_experts: int = 1
    swiglu_limit: float = 10.0
    # Routed experts (optional; V4-Flash's 6 of 256). The MoE kernels take the expert count at run time.
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    # "v4", or "v4.1" (DeepseekV41ForCausalLM): of V4.1's kernels only V4's mhc_post is planned (model_uses.V41_OPS)
    generation: str = "v4"

    @property
    def layer_ratios(self) -> tuple:
        """compress_ratios, or V4-Flash's pattern (two SWA-only layers, then 4/128 alternating, MTP SWA-only)
        when the config does not list them."""
        if self.compress_ratios:
            return tuple(self.compress_ratios)
        body = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(self.num_hidden_layers - 2)]
        return tuple(body + [0] * self.num_nextn_predict_layers)

    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def hc_hidden(self) -> int:
        return self.hc_mult * self.hidden_size

    @property
    def mix_width(self) -> int:
        # pre (hc) + post (hc) + comb (hc * hc)
        return (2 + self.hc_mult) * self.hc_mult

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ParallelConfig:
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ConfigError(f"tensor parallel size must be >= 1, got {self.tp_size}")


_HF_FIELDS = {
    "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
    "num_nextn_predict_layers": "num_nextn_predict_layers", "num_attention_heads": "num_attention_heads",
    "head_dim": "head_dim", "hc_mult": "hc_mult", "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps", "rms_norm_eps": "rms_norm_eps",
}

_OPTIONAL_FIELDS = ("qk_rope_head_dim", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
                   "compress_ratios", "q_lora_rank", "o_groups", "o_lora_rank", "moe_intermediate_size",
                   "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "swiglu_limit")

_EMBEDDED_DIR = Path(__file__).parent / "model_configs"
EMBEDDED = {"deepseek-v4-flash": "deepseek-v4-flash.json", "deepseek-v4-pro": "deepseek-v4-pro.json"}


V41_ARCHITECTURES = ("DeepseekV41ForCausalLM", "DSparkV41DraftModel")


def is_v41_config(d: dict) -> bool:
    return d.get("model_type") == "deepseek_v41" or any(a in V41_ARCHITECTURES for a in d.get("architectures") or [])


def flatten_text_config(d: dict) -> dict:
    """A config whose text model is nested under `text_config` (DeepSeek V4.1), flattened as vLLM 0.33's
    DeepseekV41Config does: the text fields at the top level (but its model_type), the top level's own winning."""
    text = d.get("text_config")
    if not isinstance(text, dict):
        return d
    return {**{k: v for k, v in text.items() if k != "model_type"}, **{k: v for k, v in d.items() if k != "text_config"}}


def from_hf_dict(d: dict, name: str) -> ModelConfig:
    d = flatten_text_config(d)
    v41 = is_v41_config(d)
    missing = [k for k in _HF_FIELDS.values() if k not in d]
    if missing:
        raise ConfigError(f"{name}: config.json lacks {', '.join(missing)} (is this a DeepSeek V4 config?)")
    kw = {ours: d[theirs] for ours, theirs in _HF_FIELDS.items()}
    for k in _OPTIONAL_FIELDS:
        if d.get(k) is not None:
            kw[k] = (tuple(int(r) for r in d[k]) if k == "compress_ratios"
                     else float(d[k]) if k == "swiglu_limit" else int(d[k]))
    cfg = ModelConfig(name=name, generation="v4.1" if v41 else "v4", **kw)
    if cfg.hc_mult < 1 or cfg.hidden_size % 256:
        raise ConfigError(f"{name}: unsupported hidden_size={cfg.hidden_size} / hc_mult={cfg.hc_mult}")
    if not 0 < cfg.qk_rope_head_dim < cfg.head_dim or cfg.sliding_window < 1 or cfg.index_topk < 1:
        raise ConfigError(f"{name}: unsupported head_dim={cfg.head_dim} / qk_rope_head_dim={cfg.qk_rope_head_dim} / "
                          f"sliding_window={cfg.sliding_window} / index_topk={cfg.index_topk}")
    bad = [r for r in cfg.compress_ratios if r not in (0, 4, 128)]
    if bad and not v41:   # V4.1's attention is not planned (model_uses.V41_OPS): its ratios bind nothing here
        raise ConfigError(f"{name}: compress_ratios holds {sorted(set(bad))}; DeepSeek V4 uses 0, 4 and 128")
    return cfg


HF_IDS = {"deepseek-v4-flash": "deepseek-ai/DeepSeek-V4-Flash", "deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}


def embedded_name(model: str | Path) -> str | None:
    """The embedded config a name stands for: 'deepseek-v4-flash', any case, or a Hugging Face id /
    hub path ending in it ('deepseek-ai/DeepSeek-V4-Flash'); None for anything else."""
    base = str(model).strip().rstrip("/").rsplit("/", 1)[-1].lower()
    return base if base in EMBEDDED else None


def load_model_config(model: str | Path) -> ModelConfig:
    """An embedded name (deepseek-v4-flash, deepseek-v4-pro), its Hugging Face id
    (deepseek-ai/DeepSeek-V4-Flash), a model dir holding config.json, or a config.json path."""
    if not str(model).strip():
        raise ConfigError("--model is empty: give deepseek-v4-flash, deepseek-v4-pro, a Hugging Face id or a "
                          "config.json path")
    key = str(model).strip().lower()
    path = Path(str(model).strip()).expanduser()
    if key not in EMBEDDED and (path.is_file() or (path / "config.json").is_file()):
        return _load_config_file(path / "config.json" if path.is_dir() else path)
    name = embedded_name(model)
    if name is not None:
        return from_hf_dict(json.loads((_EMBEDDED_DIR / EMBEDDED[name]).read_text()), name)
    if path.is_dir():
        raise ConfigError(f"--model {model}: the directory has no config.json")
    raise ConfigError(f"unknown model {model!r}: give {' or '.join(EMBEDDED)}, a Hugging Face id "
                      f"({', '.join(HF_IDS.values())}), a model dir with config.json, or a config.json path")


def _load_config_file(path: Path) -> ModelConfig:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a config.json (a JSON object was expected)")
    return from_hf_dict(data, (path.parent.name if path.name == "config.json" else path.stem) or path.stem)
