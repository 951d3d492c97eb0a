"""`agentgym/BFCL-v0`: BFCL v4's single-turn categories, scored as BFCL scores them."""
