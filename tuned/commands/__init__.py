"""The commands: `tuned`'s argument parsing and one module per subcommand."""
