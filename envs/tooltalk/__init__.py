"""agentgym/ToolTalk-v0: ToolTalk's dialogues and simulated APIs, scored by its metrics."""
