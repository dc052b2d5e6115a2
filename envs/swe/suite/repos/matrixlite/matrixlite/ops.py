"""Matrix operations; a matrix is a list of equally long rows."""


def shape(m):
    """Return (rows, columns) of m."""
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if any(len(r) != cols for r in m):
        raise ValueError("ragged matrix")
    return rows, cols


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def add(a, b):
    if shape(a) != shape(b):
        raise ValueError("shape mismatch: %s vs %s" % (shape(a), shape(b)))
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def transpose(m):
    """Return the transpose of m (an n x k matrix becomes k x n)."""
    n = len(m)
    return [[m[j][i] for j in range(n)] for i in range(n)]


def matmul(a, b):
    """Return the product a @ b."""
    (n, k), (k2, p) = shape(a), shape(b)
    if k != k2:
        raise ValueError("cannot multiply %dx%d by %dx%d" % (n, k, k2, p))
    bt = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
