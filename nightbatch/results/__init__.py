"""Result lines and the output/error files they make: one line type, the precedence of its results and their merge."""
