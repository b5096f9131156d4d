"""The configuration of `replax.model.transformer`: `ModelConfig`, a frozen dataclass that validates
itself, and the names its string fields allow."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from replax.model.attention import ATTENTION_KINDS

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")

# What each Block keeps for the backward pass (nn.remat policies; 'none': no remat).
# 'save_dots' keeps the outputs of matmuls without batch dimensions: the projections
# (q, k, v, o, gate, up, down), all 2-D matmuls in `dense`, so the backward pass redoes
# only the attention (its einsums are batched over B and KV heads, and their [T, S]
# scores are what is worth not storing) and the elementwise ops. The name that says what
# it saves; jax's checkpoint_dots_with_no_batch_dims (maxtext's 'minimal') is the same
# function. 'full' keeps only each Block's input.
REMAT_POLICIES = {
    "none": None,
    "full": None,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

# The projections LoRA may adapt (model.lora_targets): attention q, k, v, o and MLP gate,
# up, down.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the policy. Validates itself on construction."""

    vocab_size: int = 512
    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    mlp_dim: int = 1024
    # Longest sequence (prompt + completion) the positions and the KV cache allow.
    max_len: int = 256
    tie_embeddings: bool = True
    # Qwen2 puts biases on the q/k/v projections; Qwen3 normalises q and k per head.
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_theta: float = 10_000.0
    # RoPE scaling as transformers computes it (modeling_rope_utils); see `rope_inv_freq`.
    # "default" (none), "linear", "dynamic" (NTK) or "llama3" (Llama 3.1 / 3.2 / 3.3).
    rope_type: str = "default"
    rope_factor: float = 1.0
    # llama3: wavelengths above rope_original_max_len / low_freq_factor are divided by
    # factor, those below rope_original_max_len / high_freq_factor kept, smoothed between.
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    # Context length the frequencies are anchored at: llama3's
    # original_max_position_embeddings; dynamic's max_position_embeddings (0: max_len).
    rope_original_max_len: int = 0
    norm_eps: float = 1e-6
    param_dtype: str = "float32"
    dtype: str = "float32"
    # Layers under nn.scan, params stacked on a leading [num_layers] axis ("layers").
    scan_layers: bool = False
    # Activation recomputation per Block: 'none', 'full' or 'save_dots' (REMAT_POLICIES).
    remat_policy: str = "none"
    # Full-forward attention kernel: 'einsum', 'dot_product' or 'splash' (TPU only).
    attention: str = "einsum"
    # LoRA (replax.model.lora): each projection in lora_targets gains x A B * lora_alpha /
    # lora_rank, A [in, rank] and B [rank, out] trained, the base weights frozen.
    # 0: no adapters. lora_targets: a tuple or a comma-separated string of LORA_TARGETS.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        self._check_lora()
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"model.remat_policy={self.remat_policy!r}: allowed are {list(REMAT_POLICIES)}"
            )
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"model.attention={self.attention!r}: allowed are {list(ATTENTION_KINDS)}"
            )
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"model.scan_layers={self.scan_layers!r}: allowed are [False, True]")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"model.{name}={getattr(self, name)!r}: allowed are {sorted(DTYPES)}"
                )
        for name in (
            "vocab_size",
            "num_layers",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_dim",
            "max_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be >= 1")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"model.rope_type={self.rope_type!r}: allowed are {list(ROPE_TYPES)}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_type != "default" and not self.rope_factor > 0:
            raise ValueError(f"model.rope_factor={self.rope_factor} must be > 0")
        if self.rope_original_max_len < 0:
            raise ValueError(
                f"model.rope_original_max_len={self.rope_original_max_len} must be >= 0"
            )
        if self.rope_type == "llama3":
            if not self.rope_high_freq_factor > self.rope_low_freq_factor > 0:
                raise ValueError(
                    f"model.rope_high_freq_factor={self.rope_high_freq_factor} and "
                    f"rope_low_freq_factor={self.rope_low_freq_factor}: llama3 RoPE needs "
                    "high > low > 0"
                )
            if self.rope_original_max_len < 1:
                raise ValueError("model.rope_original_max_len must be >= 1 for rope_type 'llama3'")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads={self.num_kv_heads} must divide "
                f"model.num_heads={self.num_heads}"
            )

    def _check_lora(self):
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        try:
            targets = tuple(targets)
        except TypeError:
            targets = (targets,)
        bad = [t for t in targets if t not in LORA_TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            raise ValueError(
                f"model.lora_targets={self.lora_targets!r}: allowed are distinct names "
                f"among {list(LORA_TARGETS)}, at least one"
            )
        # Kept in LORA_TARGETS' order: the params and the PEFT export do not depend on how
        # the list was written.
        object.__setattr__(self, "lora_targets", tuple(t for t in LORA_TARGETS if t in targets))
        rank = self.lora_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"model.lora_rank={rank!r}: allowed are an integer >= 0 (0: LoRA off)")
        alpha = self.lora_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ValueError(f"model.lora_alpha={alpha!r}: allowed is a number > 0")

    @property
    def lora_scale(self) -> float:
        """The adapters' factor on x A B (PEFT's scaling, lora_alpha / r)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return DTYPES[self.param_dtype]
