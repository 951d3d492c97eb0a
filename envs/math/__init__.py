"""Built-in math environment."""
