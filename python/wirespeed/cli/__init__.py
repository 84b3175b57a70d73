"""The command line: one module per subcommand; main.py only registers them."""
