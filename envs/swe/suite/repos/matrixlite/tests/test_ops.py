import unittest

from matrixlite import add, identity, matmul, shape, transpose


class TestOps(unittest.TestCase):
    def test_shape(self):
        self.assertEqual(shape([[1, 2, 3], [4, 5, 6]]), (2, 3))
        with self.assertRaises(ValueError):
            shape([[1], [2, 3]])

    def test_identity(self):
        self.assertEqual(identity(2), [[1, 0], [0, 1]])

    def test_add(self):
        self.assertEqual(add([[1, 2]], [[3, 4]]), [[4, 6]])

    def test_transpose_square(self):
        self.assertEqual(transpose([[1, 2], [3, 4]]), [[1, 3], [2, 4]])

    def test_matmul_square(self):
        self.assertEqual(matmul([[1, 2], [3, 4]], identity(2)), [[1, 2], [3, 4]])

    def test_matmul_mismatch(self):
        with self.assertRaises(ValueError):
            matmul([[1, 2]], [[1, 2]])
