"""Built-in tool-use environment: calculator, SQL and chained tasks."""
