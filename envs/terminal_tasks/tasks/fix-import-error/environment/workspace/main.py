"""Multiply two integers given on the command line."""
import sys

from calc.ops import multiply

if __name__ == "__main__":
    a, b = (int(arg) for arg in sys.argv[1:3])
    print(multiply(a, b))
