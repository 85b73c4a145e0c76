"""Tool calls on the chat API: what forces them (a grammar) and what reads them (a parser)."""
