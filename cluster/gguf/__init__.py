"""`import-gguf`: a llama-family GGUF file (llama.cpp, Ollama) as an mlx-lm model folder."""
