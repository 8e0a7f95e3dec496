"""What train.py adds to a Lightning program, one public piece each (docs/architecture.md)."""
