"""An OpenAI-compatible endpoint over the policy, recording agents' episodes as exact ids."""
