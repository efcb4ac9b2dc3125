"""Result lines and the output/error files they make: one line type, its order and its merge."""
