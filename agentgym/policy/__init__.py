"""Inference backends: transformers (`hf`) and vLLM (`vllm`)."""
