"""`llmmon` subcommands beyond `serve`: each module defines `register(subparsers)`."""
