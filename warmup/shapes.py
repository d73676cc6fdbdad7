"""`EngineShapes`: every token count one serving engine can hand a kernel in one forward."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineShapes:
    """Token shapes of one engine configuration, per rank.

    * `capture_sizes` - CUDA-graph sizes in **tokens per forward**: every token count the engine captures
      a graph at (vLLM: its mixed graphs plus its FULL decode graphs; SGLang's request counts converted as
      `bs * tokens_per_seq`). Batches are padded up to one of these, so each is a count a kernel will see.
    * `max_num_tokens` - the most tokens one forward can carry (prefill chunk / batched tokens, or the
      largest decode batch if that is bigger).
    * `token_counts()` - all of 1..max_num_tokens: eager and piecewise prefill run at any count, and
      CUDA-graph decode pads to capture sizes, which lie inside that range.

    Sequence parallelism (`sequence_parallel`; vLLM 0.33 has no such pass and refuses the old
    `pass_config.enable_sp`, so only a config that sets it by hand has it): between the reduce-scatter
    and all-gather the residual stream is sharded, so those kernels see `ceil(T / tp_size)` tokens per
    rank. Those counts are inside 1..max_num_tokens, so `token_counts()` is unchanged;
    `sharded_token_counts()` gives the per-rank view.
    """
    engine: str                          # "vllm" | "sglang"
    formula_version: str
    tp_size: int
    capture_sizes: tuple[int, ...]       # tokens per forward, ascending
    max_num_tokens: int
    spec_tokens: int = 0                 # draft tokens proposed per step (vLLM K); 0 = no spec decode
    tokens_per_seq: int = 1              # decode query length: 1+K (vLLM) / num_draft_tokens (SGLang)
    capture_batch_sizes: tuple[int, ...] = ()   # SGLang's decode request counts (`--cuda-graph-bs-decode`)
    piecewise_sizes: tuple[int, ...] = ()       # SGLang prefill graphs (token counts), when on
    sequence_parallel: bool = False
    cuda_graphs: bool = True
    settings: dict = field(default_factory=dict)     # resolved engine values that fed the formula
    ignored: dict = field(default_factory=dict)      # unrelated serve flags, recorded only
    notes: tuple[str, ...] = ()                      # defaults assumed, truncations, ...

    def token_counts(self) -> range:
        return range(1, self.max_num_tokens + 1)

    def sharded_token_counts(self) -> range:
        """Per-rank counts for kernels inside a sequence-parallel region (see class docstring)."""
        if not self.sequence_parallel or self.tp_size <= 1:
            return self.token_counts()
        return range(1, -(-self.max_num_tokens // self.tp_size) + 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("capture_sizes", "capture_batch_sizes", "piecewise_sizes", "notes"):
            d[k] = list(d[k])
        d["ignored"] = {k: (v if isinstance(v, (str, int, float, bool, list, dict)) or v is None else str(v))
                        for k, v in d["ignored"].items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineShapes":
        kw = dict(d)
        for k in ("capture_sizes", "capture_batch_sizes", "piecewise_sizes", "notes"):
            kw[k] = tuple(kw.get(k, ()))
        return cls(**kw)

    def summary(self) -> str:
        cs = self.capture_sizes
        span = f"{len(cs)} capture sizes {cs[0]}..{cs[-1]}" if cs else "no CUDA graphs"
        spec = f", spec decode {self.spec_tokens} draft tokens" if self.spec_tokens else ""
        sp = ", sequence parallel" if self.sequence_parallel else ""
        return (f"{self.engine} (formula {self.formula_version}): tp={self.tp_size}, {span}, "
                f"token counts 1..{self.max_num_tokens}{spec}{sp}")
