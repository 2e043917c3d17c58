"""Stage 7: the rules, one module per family. Each family imports ``base``; ``registry`` imports
the families and assembles the rule list (no family imports it)."""
