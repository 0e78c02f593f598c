"""torch.linalg's functions over unigrad Tensors (also Tensor methods: norm, qr, svd, det,
slogdet, inverse, newton_schulz). See frontend/linalg.py for the algorithms."""
from unigrad.frontend.linalg import (det, inv, matrix_norm, newton_schulz, norm, normalize, qr,
                                     slogdet, solve, svd, svdvals, vector_norm)

__all__ = ["det", "inv", "matrix_norm", "newton_schulz", "norm", "normalize", "qr", "slogdet",
           "solve", "svd", "svdvals", "vector_norm"]
