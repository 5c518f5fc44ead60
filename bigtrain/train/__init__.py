"""Training loop, optimizer pieces and run reporting."""
