"""One Lambda handler per workflow step; each parses its versioned input and calls the core task function."""
