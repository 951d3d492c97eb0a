"""`agentgym export`: a run's model as a folder that transformers, peft and vLLM load,
with its tokenizer, config and model card (`model_folder`), uploaded to the hub on
request. What it may import: docs/overview.md#layout.
"""
