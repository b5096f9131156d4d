"""The policy network: a Llama / Qwen-family decoder in Flax, sharded by logical axes.

- `config`: `ModelConfig`, the architecture's hyper-parameters.
- `attention`: rotary embeddings, the attention kernels (XLA, and Pallas splash under
  shard_map on TPU) and the KV cache's attention.
- `layers`: parameters with logical axes, dense projections with their LoRA adapters,
  RMSNorm, SwiGLU, sharding constraints.
- `lora`: LoRA adapters: their split from the frozen base, merging, the base's fingerprint.
- `transformer`: the decoder (scanned layers, remat policies) and its parameter init.
- `logprobs`: per-token log-probabilities and entropies of completions, chunked over
  positions, over the tokenizer's vocabulary only (`mask_vocab`).
- `flops`: analytic FLOPs of a forward / train step, for MFU and modelled costs.

May import: core.
"""
