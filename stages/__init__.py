"""retrctl stages: one module per subcommand, each exposing its click command as `command`."""
