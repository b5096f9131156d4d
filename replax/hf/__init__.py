"""Hugging Face checkpoints in and out: safetensors, config.json, GGUF.

- `config`: a Hugging Face config.json to and from `ModelConfig`.
- `layout`: the parameter names and axis layouts of each supported family.
- `checkpoint`: reads sharded safetensors onto the mesh (each process reads its own
  shards) and writes a Hugging Face directory (`save_pretrained`).
- `adapters`: a LoRA run's PEFT adapter (peft loads it onto the transformers base), a
  base's fingerprint.
- `gguf`: a GGUF file (llama.cpp) read into the same parameters, dequantised.

May import: core, text, model.
"""
