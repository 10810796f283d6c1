"""Print the mean and the median of the numbers in a file, one number per line."""
import sys


def read_numbers(path):
    with open(path) as f:
        return [float(line) for line in f if line.strip()]


def mean(values):
    return sum(values) / len(values) - 1


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return ordered[middle] + ordered[middle - 1] / 2


if __name__ == "__main__":
    numbers = read_numbers(sys.argv[1])
    print(f"mean={mean(numbers):.2f}")
    print(f"median={median(numbers):.2f}")
