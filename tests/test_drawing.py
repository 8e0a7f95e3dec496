"""The dashboard's pictures: mistakes stand out in the sample grid, and the confusion matrix shades what is common."""

import numpy as np
import torch

from app.callbacks.drawing import DARK, LIGHT, RED, confusion_picture, sample_grid


def is_red(pixels: np.ndarray) -> np.ndarray:
    return np.all(np.abs(pixels.astype(int) - RED) < 60, axis=-1)


def test_mistakes_are_labelled_in_red_and_correct_predictions_are_not():
    images = torch.randint(0, 256, (16, 28, 28), dtype=torch.uint8)
    true = [str(k % 10) for k in range(16)]
    predicted = ["3" if k == 5 else label for k, label in enumerate(true)]  # one mistake, the sixth image
    grid = sample_grid(images, predicted, true, columns=8)
    assert grid.dtype == np.uint8 and grid.ndim == 3 and grid.shape[2] == 3
    cell_height, cell_width = grid.shape[0] // 2, grid.shape[1] // 8
    red_per_cell = [
        is_red(grid[row * cell_height : (row + 1) * cell_height, column * cell_width : (column + 1) * cell_width]).sum()
        for row in range(2)
        for column in range(8)
    ]
    assert red_per_cell[5] > 20
    assert sum(red_per_cell) == red_per_cell[5]


def test_confusion_matrix_is_darker_where_a_row_puts_more_of_its_samples():
    matrix = torch.full((10, 10), 1) + torch.diag(torch.full((10,), 90))
    picture = confusion_picture(matrix, [f"class {k}" for k in range(10)])
    darkest, lightest = picture.reshape(-1, 3).sum(axis=1).min(), picture.reshape(-1, 3).sum(axis=1).max()
    assert darkest < LIGHT.sum() and lightest == 3 * 255  # white background
    # The diagonal's shade is near the dark end of the scale: the darkest colour covers a good part of the picture.
    diagonal_shade = LIGHT + (90 + 1) / 100 * (DARK - LIGHT)
    near_diagonal_shade = np.all(np.abs(picture.astype(int) - diagonal_shade.astype(int)) <= 2, axis=-1)
    assert near_diagonal_shade.sum() > 10 * 30 * 30  # ten cells, most of each not covered by its count
