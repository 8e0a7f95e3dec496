"""What the user typed and what the program says back: the command line, its checks, and one line per mistake."""
