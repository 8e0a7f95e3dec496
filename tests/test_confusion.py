"""The confusion matrix picture shades what is common."""

import numpy as np
import torch

from models.confusion import DARK, LIGHT, confusion_picture


def test_confusion_matrix_is_darker_where_a_row_puts_more_of_its_samples():
    matrix = torch.full((10, 10), 1) + torch.diag(torch.full((10,), 90))
    picture = confusion_picture(matrix, [f"class {k}" for k in range(10)])
    darkest, lightest = picture.reshape(-1, 3).sum(axis=1).min(), picture.reshape(-1, 3).sum(axis=1).max()
    assert darkest < LIGHT.sum() and lightest == 3 * 255  # white background
    # The diagonal's shade is near the dark end of the scale: the darkest colour covers a good part of the picture.
    diagonal_shade = LIGHT + (90 + 1) / 100 * (DARK - LIGHT)
    near_diagonal_shade = np.all(np.abs(picture.astype(int) - diagonal_shade.astype(int)) <= 2, axis=-1)
    assert near_diagonal_shade.sum() > 10 * 30 * 30  # ten cells, most of each not covered by its count
