"""Text in and out of the policy: tokenizers and prompt formatting.

- `tokenizer`: the `Tokenizer` protocol, the byte-level tokenizer of the embedded tasks,
  chat-template prompt formatting, prompt encoding and completion decoding.
- `hf_tokenizer`: a Hugging Face `tokenizer.json` (BPE) and its chat template, read
  without transformers.

May import: core.
"""
