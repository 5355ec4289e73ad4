"""What a run reports, compared and scored (``model.READOUTS``): the challenge's
categories (``alive``) or one class per image (``argmax``: ties to the lowest index,
as ONNX ArgMax; rows without final features are all-zero rows, of class 0).
"""

from __future__ import annotations

import numpy as np


def compare_categories(ours: np.ndarray, truth: np.ndarray, show: int = 10) -> dict:
    """Exact comparison of two sorted 1-based id lists, with the first differences."""
    missing = np.setdiff1d(truth, ours)
    extra = np.setdiff1d(ours, truth)
    return {
        "passed": bool(len(missing) == 0 and len(extra) == 0),
        "expected_count": int(len(truth)),
        "got_count": int(len(ours)),
        "missing_first": missing[:show].tolist(),
        "extra_first": extra[:show].tolist(),
        "missing_count": int(len(missing)),
        "extra_count": int(len(extra)),
    }


def classes_of_rows(n_rows: int, positions: np.ndarray, features: np.ndarray) -> np.ndarray:
    """Classes of ``n_rows`` rows given the final features of the rows at ``positions``."""
    classes = np.zeros(n_rows, dtype=np.int64)
    if len(positions) and features.shape[1]:
        classes[np.asarray(positions, dtype=np.int64)] = np.argmax(features, axis=1)
    return classes


def accuracy(classes: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of images whose class equals its label."""
    labels = np.asarray(labels)
    if len(labels) != len(classes):
        raise ValueError(f"{len(classes)} predictions for {len(labels)} labels")
    return float(np.mean(np.asarray(classes) == labels)) if len(labels) else float("nan")


def compare_predictions(ours: np.ndarray, expected: np.ndarray, show: int = 10) -> dict:
    """Exact comparison of two class vectors, with the first differing 1-based image ids."""
    ours, expected = np.asarray(ours), np.asarray(expected)
    if len(ours) != len(expected):
        return {"passed": False, "expected_count": int(len(expected)),
                "got_count": int(len(ours)), "differ_count": None, "differ_first": []}
    differ = np.flatnonzero(ours != expected)
    return {
        "passed": bool(len(differ) == 0),
        "expected_count": int(len(expected)),
        "got_count": int(len(ours)),
        "differ_count": int(len(differ)),
        "differ_first": (differ[:show] + 1).tolist(),
    }
