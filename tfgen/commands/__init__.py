"""`tfgen` subcommands: each module here has `add_parser(subparsers)` registering one subcommand."""
