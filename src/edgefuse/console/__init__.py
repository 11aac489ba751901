"""What the application writes: how a command ends, its progress lines, its tables."""
