"""Hugging Face checkpoints in and out: safetensors, config.json, GGUF.

- `config`: a Hugging Face config.json to and from `ModelConfig`.
- `layout`: the parameter names and axis layouts of each supported family.
- `checkpoint`: reads sharded safetensors onto the mesh (each process reads its own
  shards) and writes a Hugging Face directory (`save_pretrained`).
- `gguf`: a GGUF file (llama.cpp) read into the same parameters, dequantised.

May import: core, text, model.
"""
