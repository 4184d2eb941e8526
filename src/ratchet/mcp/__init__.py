"""`ratchet mcp`: the study of one repository as Model Context Protocol tools.

An agent a person runs (Claude Code, Codex, Cursor, ...) drives the study through seven
tools and never through the repository: the server holds the repository, the ledger and
`.ratchet/`, so the agent may run in a throwaway directory of its own.

    tools.py   what each tool does, on the CLI's own paths (submit, wait, show, idea):
               plain dicts in, plain dicts out, bad input a ToolInputError naming the field
    server.py  the MCP server (the official `mcp` SDK's MCPServer): typed schemas and
               descriptions over tools.py, stdio or streamable HTTP on loopback with a token
    config.py  `ratchet mcp --print-config claude|codex|cursor`: the line for each client
"""
