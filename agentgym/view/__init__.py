"""`agentgym view`: a run's or an evaluation's episodes in the browser, the loss mask on the
exact token ids (`data` reads the files, `page` writes the self-contained page)."""
