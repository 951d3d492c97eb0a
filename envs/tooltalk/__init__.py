"""agentgym/ToolTalk-v0: ToolTalk's published dialogues and simulated APIs, scored by its metrics."""
