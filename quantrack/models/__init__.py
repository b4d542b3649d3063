"""Models and where they come from: model references (hf:, gguf:, local paths), the GGUF table and file
metadata, Hugging Face configs and the Qwen2 export, the hub cache."""
