"""A brute-force reference the prefix-cache tests share, written apart from the code it checks."""


def lcp(a, b):
    """The length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
