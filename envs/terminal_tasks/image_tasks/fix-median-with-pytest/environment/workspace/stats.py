"""Small statistics helpers."""


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle]
