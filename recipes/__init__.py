"""Small, tested recipes for using chronoq from web frameworks (not installed with chronoq)."""
